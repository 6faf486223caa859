"""Alerting: the alert state machine, grouping and inhibition, routing, Alertmanager and delivery."""
