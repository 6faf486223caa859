"""The job-health UI: panel queries on ClickHouse, an aiohttp server, and self-contained HTML reports."""
