"""Offline tools: replay a recording through the engine, replay Kafka ranges, evaluate rules on labelled cases."""
