"""The worker runtime: partition tasks, the side path, alignment, checkpoints and changelogs, the Kafka loops."""
