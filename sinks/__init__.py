"""ranksight sinks: ClickHouse tables and the Kafka -> ClickHouse sink consumer.

- `sinks.clickhouse`: `connect(dsn)` (chDB in process or a server), one cached client per DSN.
- `sinks.ddl`: tables generated from the Avro schemas, `migrate(client, ttl_days)`.
- `sinks.rows`: Event -> row conversion (pure).
- `sinks.writer`: `ClickHouseSink`, the batching `add` / `flush` / `write(batch)` contract.
- `sinks.consumer`: `SinkConsumer`, commit-after-insert consumption with a dead-letter topic.
"""
