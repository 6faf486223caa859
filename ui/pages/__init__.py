"""The UI's pages, one module each: a page's store queries and its fold from a recording side by side.

`fleet`, `job` (with `job_steps` and `job_details`), `alert`, `history`, `compare` and `efficiency`
answer the JSON the page script renders, from a ClickHouse store or from a replayed recording
(a report); `common` and `recording` hold what they share. `ui.server` routes requests to them.
"""
