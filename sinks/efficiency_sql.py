"""SQL of the efficiency roll-ups and views (docs/efficiency.md), generated here, applied by `sinks.ddl`.

Two roll-ups are maintained by materialized views as rows are inserted, so nothing re-reads the
raw tables to answer a job's efficiency:

- `run_step_progress`: one row per (job, run, step): the slowest rank's step time, tokens and
  samples over ranks, rank reports, skipped, and the step's completion (its last rank's time),
  which is the run's progress heartbeat. A 512-rank job's 3 million step rows become 6 000.
- `gpu_energy_minute`: per GPU and minute (and the job the node attributed the samples to, '' for
  none), the lowest and highest energy counter reading and the first and last sample time.

`run_efficiency_sql` and `job_efficiency_sql` compute goodput from them. Time lost to stalls
comes from the heartbeat: each step's interval runs from the previous step's completion (the
run's start for the first step) to its own, less the checkpoints and evaluations that ended in
it. An interval longer than `STALL_INTERVAL_FACTOR` x the run's median interval is a stall: the
step is credited with at most one median interval and the rest is stall time, whether or not
the training loop counted it into `step_time_s` (a data wait that lasted minutes). Otherwise the
step is credited with its own `step_time_s`, never more than its interval, and the rest of the
interval is stall time too (idle between steps). So productive, stall, checkpoint and
evaluation time add up to at most the run's wall time, and goodput never exceeds 100 %.

Energy per GPU and run is the highest minus the lowest counter reading inside the run's window:
read from the roll-up's minutes that lie wholly inside the window, and from the raw samples of
the (at most two) minutes a window edge cuts, so the figure is exact, not rounded to minutes.

For one job the statements carry parameters (clickhouse-connect binds them: `%(job)s`, and
`%(jobs)s` for the job with its workload family's single-node jobs, the scaling baseline) and
read only those jobs' rows; the views are the same statements without them.
"""

from __future__ import annotations

__all__ = [
    "ENERGY_ROLLUP",
    "ROLLUP_TIME_COLUMNS",
    "RUN_COLUMNS",
    "STALL_INTERVAL_FACTOR",
    "STEP_ROLLUP",
    "backfill_sql",
    "job_efficiency_sql",
    "rollup_sql",
    "rollup_view_sql",
    "run_efficiency_sql",
    "view_sql",
]

# A step interval longer than this many times the run's median interval is a stall (not a slow
# step): far outside step-to-step noise, well inside the detector's `stall_interval_factor` (10).
STALL_INTERVAL_FACTOR = 3.0

# The columns of `run_efficiency`, in order (a test checks them against the view).
RUN_COLUMNS: tuple[str, ...] = (
    "job_id", "run_id", "team", "owner", "gpu_class", "workload_family", "node_count", "gpus", "outcome",
    "started", "ended", "wall_s", "allocated_gpu_h", "steps", "step_s", "restart_lost_s", "skipped_s",
    "productive_s", "checkpoint_s", "evaluation_s", "stall_s", "goodput_pct", "tokens", "samples",
    "tokens_per_gpu_h", "samples_per_gpu_h", "tokens_per_gpu_s", "energy_kwh", "kwh_per_billion_tokens",
    "failed_work_s", "verified_checkpoints", "last_verified_step",
)  # fmt: skip

STEP_ROLLUP = "run_step_progress"
ENERGY_ROLLUP = "gpu_energy_minute"
# The time column each roll-up's TTL counts from (retention follows the raw tables').
ROLLUP_TIME_COLUMNS: dict[str, str] = {STEP_ROLLUP: "done_ts", ENERGY_ROLLUP: "minute"}

_MS = "toUnixTimestamp64Milli"
_FAR_FUTURE = "toDateTime64('2200-01-01 00:00:00', 3, 'UTC')"


def _ttl(column: str, ttl_days: int | None) -> str:
    return f"\nTTL toDateTime({column}) + INTERVAL {int(ttl_days)} DAY" if ttl_days else ""


def rollup_sql(ttl_days: int | None, dedup_window: int) -> list[str]:
    """`CREATE` statements of the two roll-up tables (`rollup_view_sql` makes the views that feed them)."""
    # The dedup window on the targets too: an insert the raw table deduplicated (a retried batch,
    # same token) must not reach the roll-up a second time.
    settings = f"\nSETTINGS non_replicated_deduplication_window = {dedup_window}"
    return [
        f"CREATE TABLE IF NOT EXISTS {STEP_ROLLUP} (\n"
        "    job_id LowCardinality(String), run_id LowCardinality(String), step Int64,\n"
        "    reports SimpleAggregateFunction(sum, UInt64),\n"
        "    step_time_s SimpleAggregateFunction(max, Float64),\n"
        "    tokens SimpleAggregateFunction(sum, Int64),\n"
        "    samples SimpleAggregateFunction(sum, Int64),\n"
        "    skipped SimpleAggregateFunction(max, Bool),\n"
        "    done_ts SimpleAggregateFunction(max, DateTime64(3, 'UTC'))\n"
        ")\nENGINE = AggregatingMergeTree\n"
        f"ORDER BY (job_id, run_id, step){_ttl('done_ts', ttl_days)}{settings}",
        f"CREATE TABLE IF NOT EXISTS {ENERGY_ROLLUP} (\n"
        "    job_id LowCardinality(String), cluster LowCardinality(String), node LowCardinality(String),\n"
        "    gpu_index Int32, gpu_uuid LowCardinality(String), minute DateTime('UTC'),\n"
        "    energy_min SimpleAggregateFunction(min, Int64),\n"
        "    energy_max SimpleAggregateFunction(max, Int64),\n"
        "    first_ts SimpleAggregateFunction(min, DateTime64(3, 'UTC')),\n"
        "    last_ts SimpleAggregateFunction(max, DateTime64(3, 'UTC'))\n"
        ")\nENGINE = AggregatingMergeTree\nPARTITION BY toDate(minute)\n"
        f"ORDER BY (job_id, cluster, node, gpu_index, gpu_uuid, minute){_ttl('minute', ttl_days)}{settings}",
    ]


def rollup_view_sql() -> list[str]:
    """The materialized views that feed the roll-ups from every insert into `steps` and `gpu_samples`."""
    return [
        f"CREATE MATERIALIZED VIEW IF NOT EXISTS {STEP_ROLLUP}_mv TO {STEP_ROLLUP} AS\n{_step_rollup_select()}",
        f"CREATE MATERIALIZED VIEW IF NOT EXISTS {ENERGY_ROLLUP}_mv TO {ENERGY_ROLLUP} AS\n{_energy_rollup_select()}",
    ]


def _step_rollup_select(guard: str = "") -> str:
    return (
        "SELECT job_id, run_id, step, count() AS reports, max(step_time_s) AS step_time_s,\n"
        "    sum(ifNull(tokens, 0)) AS tokens, sum(ifNull(samples, 0)) AS samples, max(skipped) AS skipped,\n"
        "    max(ts) AS done_ts\n"
        f"FROM steps{_unless_filled(guard, ' WHERE')} GROUP BY job_id, run_id, step"
    )


def _energy_rollup_select(guard: str = "") -> str:
    return (
        "SELECT ifNull(job_id, '') AS job_id, cluster, node, gpu_index, gpu_uuid,\n"
        "    toStartOfMinute(toDateTime(ts)) AS minute, min(assumeNotNull(energy_mj)) AS energy_min,\n"
        "    max(assumeNotNull(energy_mj)) AS energy_max, min(ts) AS first_ts, max(ts) AS last_ts\n"
        f"FROM gpu_samples WHERE energy_mj IS NOT NULL{_unless_filled(guard, ' AND')}\n"
        "GROUP BY job_id, cluster, node, gpu_index, gpu_uuid, minute"
    )


def _unless_filled(table: str, keyword: str) -> str:
    # IF NOT EXISTS for a backfill: nothing when the roll-up already holds rows.
    return f"{keyword} NOT EXISTS (SELECT 1 FROM {table})" if table else ""


def backfill_sql() -> list[str]:
    """Fill the empty roll-ups from rows stored before they existed; a no-op once they hold rows.

    `migrate` runs these after creating the roll-up tables and before their materialized views, so
    a repeated migration adds nothing twice; a row a concurrent sink (a shared server) inserts in
    between would be missing, so upgrade a server's store with its sinks stopped (`ranksight sink`
    migrates before it reads).
    """
    return [
        f"INSERT INTO {STEP_ROLLUP} {_step_rollup_select(guard=STEP_ROLLUP)}",
        f"INSERT INTO {ENERGY_ROLLUP} {_energy_rollup_select(guard=ENERGY_ROLLUP)}",
    ]


def view_sql() -> list[str]:
    """`CREATE OR REPLACE VIEW` of `run_efficiency` and `job_efficiency` over the roll-ups."""
    return [
        f"CREATE OR REPLACE VIEW run_efficiency AS\n{run_efficiency_sql()}",
        f"CREATE OR REPLACE VIEW job_efficiency AS\n{job_efficiency_sql()}",
    ]


def run_efficiency_sql(jobs: str = "") -> str:
    """One row per (job, run); `jobs` is a condition on `job_id` selecting the jobs ('' all).

    Written so each source is read once or twice: a run's steps become parallel arrays ordered by
    completion (the heartbeat) and its accounting is array arithmetic, not joins and windows over
    every step; ClickHouse re-plans a CTE at every reference, and planning dominated otherwise.
    """
    where = f" WHERE {jobs}" if jobs else ""
    also = f" AND {jobs}" if jobs else ""
    accounted = _accounted_sql()
    energy = _energy_sql(also)
    return f"""WITH
runs AS (
    SELECT job_id, run_id, min(ts) AS started, argMax(world_size, ts) AS gpus,
        argMax(gpu_class, ts) AS gpu_class, argMax(workload_family, ts) AS workload_family,
        argMax(team, ts) AS team, argMax(owner, ts) AS owner, argMax(length(nodes), ts) AS node_count
    FROM job_started{where} GROUP BY job_id, run_id
),
ordered AS (
    SELECT *, started = max(started) OVER (PARTITION BY job_id) AS is_last,
        leadInFrame(toNullable(started)) OVER (PARTITION BY job_id ORDER BY started
            ROWS BETWEEN CURRENT ROW AND 1 FOLLOWING) AS next_started
    FROM runs
),
series AS (
    -- Per run, its steps in completion order (the progress heartbeat), one tuple each.
    SELECT job_id, run_id, arraySort(x -> (x.1, x.2), groupArray((ts, step, step_s, skipped, tokens, samples, reports))) AS beats
    FROM (
        SELECT job_id, run_id, step, max(done_ts) AS ts, max(step_time_s) AS step_s, max(skipped) AS skipped,
            sum(tokens) AS tokens, sum(samples) AS samples, sum(reports) AS reports
        FROM {STEP_ROLLUP}{where} GROUP BY job_id, run_id, step
    ) GROUP BY job_id, run_id
),
run_checkpoints AS (
    SELECT job_id, run_id, sum(write_s) AS checkpoint_s, countIf(verified) AS verified_n,
        maxIf(verified_step, verified) AS last_verified_step, maxIf(verified_ts, verified) AS last_verified_ts,
        groupArrayIf(written_ts, written) AS pause_ends, groupArrayIf(write_s, written) AS pause_lengths
    FROM (
        SELECT job_id, run_id, checkpoint_id, ifNull(maxIf(duration_s, phase IN ('completed', 'failed')), 0) AS write_s,
            maxIf(ts, phase IN ('completed', 'failed')) AS written_ts, countIf(phase IN ('completed', 'failed')) > 0 AS written,
            countIf(phase = 'verified') > 0 AS verified, maxIf(step, phase = 'verified') AS verified_step,
            maxIf(ts, phase = 'verified') AS verified_ts
        FROM checkpoints{where} GROUP BY job_id, run_id, checkpoint_id
    ) GROUP BY job_id, run_id
),
run_evaluations AS (
    SELECT job_id, run_id, sum(eval_s) AS evaluation_s, groupArrayIf(ended_ts, ended) AS pause_ends,
        groupArrayIf(eval_s, ended) AS pause_lengths
    FROM (
        SELECT job_id, run_id, evaluation_id, ifNull(maxIf(duration_s, phase IN ('completed', 'failed')), 0) AS eval_s,
            maxIf(ts, phase IN ('completed', 'failed')) AS ended_ts, countIf(phase IN ('completed', 'failed')) > 0 AS ended
        FROM evaluations{where} GROUP BY job_id, run_id, evaluation_id
    ) GROUP BY job_id, run_id
),
activity AS (
    SELECT job_id, run_id, max(ts) AS last_ts FROM (
        SELECT job_id, run_id, done_ts AS ts FROM {STEP_ROLLUP}{where}
        UNION ALL SELECT job_id, run_id, ts FROM checkpoints{where}
        UNION ALL SELECT job_id, run_id, ts FROM evaluations{where}
    ) GROUP BY job_id, run_id
),
accounted AS (
{accounted}
),
job_last AS (
    SELECT job_id, argMax(state, ts) AS state, max(ts) AS state_ts FROM job_states{where} GROUP BY job_id
),
{energy},
base AS (
    SELECT r.job_id AS job_id, r.run_id AS run_id, r.team AS team, r.owner AS owner, r.gpu_class AS gpu_class,
        r.workload_family AS workload_family, r.node_count AS node_count, r.gpus AS gpus, r.started AS started,
        r.steps AS steps, r.step_s AS step_s, r.skipped_s AS skipped_s, r.unsaved_s AS unsaved_s,
        r.between_s AS between_s, r.last_step_ts AS last_step_ts, r.tail_pause_s AS tail_pause_s,
        r.tokens_all AS tokens_all, r.unsaved_tokens AS unsaved_tokens, r.samples_all AS samples_all,
        r.unsaved_samples AS unsaved_samples, r.checkpoint_s AS checkpoint_s, r.evaluation_s AS evaluation_s,
        r.verified_n AS verified_n, r.verified_step AS verified_step, r.verified_ts AS verified_ts,
        multiIf(
            NOT r.is_last, 'restarted',
            j.state_ts < r.started, 'running',
            j.state IN ('pending', 'restarting'), 'restarted',
            j.state IN ('completed', 'failed', 'preempted'), j.state,
            'running'
        ) AS outcome,
        greatest(r.started, a.last_ts, if(r.is_last AND outcome != 'running', j.state_ts, r.started)) AS ended,
        w.energy_mj AS energy_mj
    FROM accounted AS r
    LEFT JOIN activity AS a ON r.job_id = a.job_id AND r.run_id = a.run_id
    LEFT JOIN run_energy AS w ON r.job_id = w.job_id AND r.run_id = w.run_id
    LEFT JOIN job_last AS j ON r.job_id = j.job_id
)
SELECT job_id, run_id, team, owner, gpu_class, workload_family, node_count, gpus, outcome,
    started, ended, ({_MS}(ended) - {_MS}(started)) / 1000 AS wall_s,
    gpus * wall_s / 3600 AS allocated_gpu_h,
    steps, step_s,
    if(outcome IN ('restarted', 'failed', 'preempted'), unsaved_s, 0) AS restart_lost_s,
    skipped_s,
    step_s - skipped_s - restart_lost_s AS productive_s,
    checkpoint_s, evaluation_s,
    between_s + greatest(0, ({_MS}(ended) - {_MS}(last_step_ts)) / 1000 - tail_pause_s) AS stall_s,
    if(wall_s > 0, least(100, 100 * productive_s / wall_s), NULL) AS goodput_pct,
    tokens_all - if(outcome IN ('restarted', 'failed', 'preempted'), unsaved_tokens, 0) AS tokens,
    samples_all - if(outcome IN ('restarted', 'failed', 'preempted'), unsaved_samples, 0) AS samples,
    if(allocated_gpu_h > 0, tokens / allocated_gpu_h, NULL) AS tokens_per_gpu_h,
    if(allocated_gpu_h > 0, samples / allocated_gpu_h, NULL) AS samples_per_gpu_h,
    if(productive_s > 0 AND gpus > 0, tokens / (productive_s * gpus), NULL) AS tokens_per_gpu_s,
    energy_mj / 3.6e9 AS energy_kwh,
    if(tokens > 0, energy_kwh / (tokens / 1e9), NULL) AS kwh_per_billion_tokens,
    if(outcome IN ('restarted', 'failed', 'preempted'),
        ({_MS}(ended) - {_MS}(if(verified_n > 0, greatest(verified_ts, started), started))) / 1000, 0
    ) AS failed_work_s,
    verified_n AS verified_checkpoints, if(verified_n > 0, verified_step, NULL) AS last_verified_step
FROM base"""


def _layered(source: str, layers: list[list[str]]) -> str:
    """`SELECT *, <layer> FROM (...)` nested once per layer: each layer reads the columns of the one
    inside it. Aliases in one SELECT are expanded where used, and these array lambdas nest deep:
    planning one flat SELECT took longer than running it."""
    sql = source
    for columns in layers:
        sql = "SELECT *,\n    " + ",\n    ".join(columns) + f"\nFROM (\n{sql}\n)"
    return sql


def _energy_sql(also: str) -> str:
    """The `windows` and `run_energy` CTEs: whose GPU energy each run holds, and how much its GPUs drew."""
    one_ms = "toIntervalMillisecond(1)"
    return f"""windows AS (
    -- Whose GPU energy a run holds: attributed at the node, the job's GPUs from the run's start to the
    -- next run's start; not attributed, a GPU bound to a rank of the run, from the binding to the run's
    -- last activity. (`node`, `gpu_uuid` are '' for the first kind: every GPU of the job.)
    SELECT job_id AS holder, job_id, run_id, '' AS node, '' AS gpu_uuid, started AS window_start,
        ifNull(next_started, {_FAR_FUTURE}) AS window_end
    FROM ordered
    UNION ALL
    SELECT '' AS holder, b.job_id AS job_id, b.run_id AS run_id, b.node AS node, b.gpu_uuid AS gpu_uuid,
        b.bound_ts AS window_start, a.last_ts + {one_ms} AS window_end
    FROM (
        SELECT job_id, run_id, node, assumeNotNull(gpu_uuid) AS gpu_uuid, min(ts) AS bound_ts
        FROM rank_bound WHERE gpu_uuid IS NOT NULL{also} GROUP BY job_id, run_id, node, gpu_uuid
    ) AS b INNER JOIN activity AS a ON b.job_id = a.job_id AND b.run_id = a.run_id
),
run_energy AS (
    -- Per GPU and window, the highest minus the lowest counter reading inside it: the roll-up's minutes
    -- that lie wholly inside, and the raw readings of the minutes a window's edge cuts (min and max
    -- are the same whichever way a reading is counted twice).
    SELECT job_id, run_id, sum(energy_mj) AS energy_mj FROM (
        SELECT job_id, run_id, holder, node, gpu_uuid, max(energy_max) - min(energy_min) AS energy_mj FROM (
            SELECT w.job_id AS job_id, w.run_id AS run_id, w.holder AS holder, e.node AS node, e.gpu_uuid AS gpu_uuid,
                e.energy_min AS energy_min, e.energy_max AS energy_max
            FROM {ENERGY_ROLLUP} AS e INNER JOIN windows AS w ON e.job_id = w.holder
                AND if(e.job_id = '', e.node, '') = w.node AND if(e.job_id = '', e.gpu_uuid, '') = w.gpu_uuid
            WHERE e.first_ts >= w.window_start AND e.last_ts < w.window_end
            UNION ALL
            SELECT w.job_id AS job_id, w.run_id AS run_id, w.holder AS holder, g.node AS node, g.gpu_uuid AS gpu_uuid,
                g.energy AS energy_min, g.energy AS energy_max
            FROM (
                SELECT ifNull(job_id, '') AS holder, node, gpu_uuid, ts, assumeNotNull(energy_mj) AS energy
                FROM gpu_samples
                WHERE energy_mj IS NOT NULL AND (cluster, node, gpu_index, toStartOfMinute(toDateTime(ts))) IN (
                    SELECT e.cluster, e.node, e.gpu_index, e.minute
                    FROM {ENERGY_ROLLUP} AS e INNER JOIN windows AS w ON e.job_id = w.holder
                        AND if(e.job_id = '', e.node, '') = w.node AND if(e.job_id = '', e.gpu_uuid, '') = w.gpu_uuid
                    WHERE e.last_ts >= w.window_start AND e.first_ts < w.window_end
                        AND NOT (e.first_ts >= w.window_start AND e.last_ts < w.window_end)
                )
            ) AS g INNER JOIN windows AS w ON g.holder = w.holder
                AND if(g.holder = '', g.node, '') = w.node AND if(g.holder = '', g.gpu_uuid, '') = w.gpu_uuid
            WHERE g.ts >= w.window_start AND g.ts < w.window_end
        ) GROUP BY job_id, run_id, holder, node, gpu_uuid
    ) GROUP BY job_id, run_id
)"""


def _accounted_sql() -> str:
    """Per run: its heartbeat accounting (docs/efficiency.md, "Stalls"), as array arithmetic."""
    k = STALL_INTERVAL_FACTOR
    source = (
        "SELECT r.job_id AS job_id, r.run_id AS run_id, r.started AS started, r.gpus AS gpus,\n"
        "    r.gpu_class AS gpu_class, r.workload_family AS workload_family, r.team AS team, r.owner AS owner,\n"
        "    r.node_count AS node_count, r.is_last AS is_last, c.checkpoint_s AS checkpoint_s,\n"
        "    c.verified_n AS verified_n, c.last_verified_step AS verified_step, c.last_verified_ts AS verified_ts,\n"
        "    e.evaluation_s AS evaluation_s, s.beats AS beats,\n"
        "    arrayConcat(c.pause_ends, e.pause_ends) AS pause_ends,\n"
        "    arrayConcat(c.pause_lengths, e.pause_lengths) AS pause_lengths\n"
        "FROM ordered AS r\n"
        "LEFT JOIN series AS s ON r.job_id = s.job_id AND r.run_id = s.run_id\n"
        "LEFT JOIN run_checkpoints AS c ON r.job_id = c.job_id AND r.run_id = c.run_id\n"
        "LEFT JOIN run_evaluations AS e ON r.job_id = e.job_id AND r.run_id = e.run_id"
    )
    return _layered(
        source,
        [
            [
                "arrayMap(x -> x.1, beats) AS done",
                "arrayMap(x -> x.2, beats) AS step_numbers",
                "arrayMap(x -> x.3, beats) AS step_secs",
                "arrayMap(x -> x.4, beats) AS skipped_flags",
                # A rank-step reported twice (a re-sent record) shows as more reports than ranks: scaled back.
                "arrayMap(x -> toInt64(round(x.5 * if(gpus > 0, least(1, gpus / greatest(x.7, 1)), 1))), beats)"
                " AS step_tokens",
                "arrayMap(x -> toInt64(round(x.6 * if(gpus > 0, least(1, gpus / greatest(x.7, 1)), 1))), beats)"
                " AS step_samples",
            ],
            [
                # Each step's interval: from the previous step's completion (the run's start for the first).
                f"arrayMap((t, p) -> greatest(0, {_MS}(t) - {_MS}(p)) / 1000, done, arrayPushFront(arrayPopBack(done), started))"
                " AS intervals",
                # Checkpoint writes and evaluations count in the interval they ended in (before a step at the
                # same time); after the last step, in the tail.
                "arraySort(x -> (x.1, x.2), arrayConcat(arrayMap((t, l) -> (t, 0, l), pause_ends, pause_lengths),"
                " arrayMap(t -> (t, 1, 0.), done))) AS timeline",
                "arrayMap(n -> verified_n > 0 AND n <= verified_step, step_numbers) AS saved",
                "length(done) AS steps",
                "if(steps > 0, done[-1], started) AS last_step_ts",
            ],
            [
                "if(length(intervals) > 1, arrayReduce('quantileExact(0.5)', arrayPopFront(intervals)), 0) AS normal_s",
                "arrayFilter((p, x) -> x.2 = 1, arrayCumSum(arrayMap(x -> x.3, timeline)), timeline) AS paused_by",
            ],
            [
                "arrayMap((a, b) -> a - b, paused_by, arrayPushFront(arrayPopBack(paused_by), 0.)) AS paused",
                "arraySum(pause_lengths) - if(length(paused_by) > 0, paused_by[-1], 0) AS tail_pause_s",
            ],
            ["arrayMap((g, q) -> greatest(0, g - q), intervals, paused) AS open"],
            [
                # A step is credited with its own step time, never more than its interval less pauses, and
                # never more than one normal interval when that is over k x the normal one (a stall inside it).
                f"arrayMap((o, w) -> least(w, if(normal_s > 0 AND o > {k} * normal_s, normal_s, o)), open, step_secs)"
                " AS work",
            ],
            [
                "arraySum(work) AS step_s",
                "arraySum(open) - arraySum(work) AS between_s",
                "arraySum(arrayMap((w, f) -> if(f, w, 0), work, skipped_flags)) AS skipped_s",
                "arraySum(arrayMap((w, f, v) -> if(f OR v, 0, w), work, skipped_flags, saved)) AS unsaved_s",
                "arraySum(arrayMap((t, f) -> if(f, 0, t), step_tokens, skipped_flags)) AS tokens_all",
                "arraySum(arrayMap((t, f, v) -> if(f OR v, 0, t), step_tokens, skipped_flags, saved)) AS unsaved_tokens",
                "arraySum(arrayMap((t, f) -> if(f, 0, t), step_samples, skipped_flags)) AS samples_all",
                "arraySum(arrayMap((t, f, v) -> if(f OR v, 0, t), step_samples, skipped_flags, saved))"
                " AS unsaved_samples",
            ],
        ],
    )


def job_efficiency_sql(job: bool = False, with_runs: bool = False) -> str:
    """One row per job; with `job`, only the job bound to `%(job)s`, from the runs of the jobs in `%(jobs)s`.

    `with_runs` adds `run_rows`: the job's `run_efficiency` rows as tuples (`RUN_COLUMNS`) in start
    order, so a job page gets its job and run figures from one statement (planned and run once).

    `%(jobs)s` holds the job and the single-node jobs of its workload family (its scaling baseline):
    the caller looks them up first (`sinks.efficiency.family_jobs`), so every table is read with a
    literal list instead of a subquery per table.
    """
    # The view reads the `run_efficiency` view. The job's runs and its baseline come out of one pass
    # (the baseline is a window over the family), so the run SQL is planned once.
    runs = f"({run_efficiency_sql('job_id IN %(jobs)s')})" if job else "run_efficiency"
    only = " WHERE job_id = %(job)s" if job else ""
    submitted = " AND job_id = %(job)s" if job else ""
    started = RUN_COLUMNS.index("started") + 1
    runs_detail = (
        f",\n        arraySort(x -> x.{started}, groupArray(tuple({', '.join(RUN_COLUMNS)}))) AS j_run_rows"
        if with_runs
        else ""
    )
    runs_column = ",\n    r.j_run_rows AS run_rows" if with_runs else ""
    return f"""WITH
queue_attempts AS (
    SELECT job_id, submit_ts,
        if(countIf(state = 'running') > 0, minIf(ts, state = 'running'),
           if(countIf(state IN ('completed', 'failed')) > 0, minIf(ts, state IN ('completed', 'failed')), now64(3))
        ) AS left_queue
    FROM job_states WHERE submit_ts IS NOT NULL{submitted} GROUP BY job_id, submit_ts
),
queue AS (
    SELECT job_id, sum(greatest(0, {_MS}(left_queue) - {_MS}(assumeNotNull(submit_ts)))) / 1000 AS queue_s
    FROM queue_attempts GROUP BY job_id
),
states AS (
    SELECT job_id, max(restart_count) AS s_restarts, argMax(state, ts) AS s_state,
        ifNull(argMaxIf(team, ts, team IS NOT NULL), '') AS s_team,
        ifNull(argMaxIf(owner, ts, owner IS NOT NULL), '') AS s_owner, min(ts) AS s_first, max(ts) AS s_last,
        -- Without the scheduler's submit times: first running minus first pending.
        if(countIf(submit_ts IS NOT NULL) = 0 AND countIf(state = 'pending') > 0 AND countIf(state = 'running') > 0,
           ({_MS}(minIf(ts, state = 'running')) - {_MS}(minIf(ts, state = 'pending'))) / 1000, NULL) AS s_queue_s
    FROM job_states{only} GROUP BY job_id
),
run_rows AS (
    -- The scaling baseline of each run's workload family: the median throughput per GPU of its ended
    -- single-node runs.
    SELECT *, quantileExactIf(0.5)(tokens_per_gpu_s,
            node_count = 1 AND workload_family != '' AND tokens_per_gpu_s > 0 AND outcome != 'running')
        OVER (PARTITION BY workload_family) AS family_tokens_per_gpu_s
    FROM {runs}
),
job_runs AS (
    SELECT job_id, count() AS j_runs, argMax(team, started) AS j_team, argMax(owner, started) AS j_owner,
        argMax(gpu_class, started) AS j_gpu_class, argMax(workload_family, started) AS j_workload_family,
        argMax(node_count, started) AS j_node_count, argMax(gpus, started) AS j_gpus,
        argMax(outcome, started) AS j_last_outcome, min(started) AS j_first_started, max(ended) AS j_last_ended,
        argMax(family_tokens_per_gpu_s, started) AS j_family_tokens_per_gpu_s,
        sum(allocated_gpu_h) AS j_allocated_gpu_h,
        sum(gpus * productive_s) / 3600 AS j_productive_gpu_h,
        sum(gpus * stall_s) / 3600 AS j_stall_gpu_h,
        sum(gpus * restart_lost_s) / 3600 AS j_restart_gpu_h,
        sum(gpus * skipped_s) / 3600 AS j_skipped_gpu_h,
        sum(gpus * checkpoint_s) / 3600 AS j_checkpoint_gpu_h,
        sum(gpus * evaluation_s) / 3600 AS j_evaluation_gpu_h,
        sum(gpus * failed_work_s) / 3600 AS j_failed_work_gpu_h,
        sum(tokens) AS j_tokens, sum(samples) AS j_samples, sum(energy_kwh) AS j_energy_kwh,
        sum(productive_s * gpus) AS j_productive_gpu_s{runs_detail}
    FROM run_rows{only} GROUP BY job_id
),
ids AS (
    -- Jobs known only from the scheduler (queued, or run without the SDK) are listed too. (Not read
    -- from job_runs: a second reference would plan and run the whole run statement again.)
    SELECT DISTINCT job_id FROM (SELECT job_id FROM job_started{only} UNION ALL SELECT job_id FROM job_states{only})
)
SELECT i.job_id AS job_id, if(r.j_runs > 0, r.j_team, st.s_team) AS team,
    if(r.j_runs > 0, r.j_owner, st.s_owner) AS owner, r.j_gpu_class AS gpu_class,
    r.j_workload_family AS workload_family, r.j_node_count AS node_count, r.j_gpus AS gpus,
    if(r.j_runs > 0, r.j_last_outcome, if(st.s_state = 'restarting', 'restarted', st.s_state)) AS outcome,
    r.j_runs AS runs, greatest(toInt64(r.j_runs) - 1, toInt64(st.s_restarts)) AS restarts,
    if(r.j_runs > 0, r.j_first_started, st.s_first) AS started,
    if(r.j_runs > 0, r.j_last_ended, st.s_last) AS ended,
    if(q.job_id != '', q.queue_s, st.s_queue_s) AS queue_s,
    r.j_allocated_gpu_h AS allocated_gpu_h, r.j_productive_gpu_h AS productive_gpu_h,
    r.j_stall_gpu_h AS stall_gpu_h, r.j_restart_gpu_h AS restart_gpu_h, r.j_skipped_gpu_h AS skipped_gpu_h,
    r.j_checkpoint_gpu_h AS checkpoint_gpu_h, r.j_evaluation_gpu_h AS evaluation_gpu_h,
    if(r.j_allocated_gpu_h > 0, least(100, 100 * r.j_productive_gpu_h / r.j_allocated_gpu_h), NULL) AS goodput_pct,
    if(r.j_allocated_gpu_h > 0, 100 * r.j_failed_work_gpu_h / r.j_allocated_gpu_h, NULL) AS failed_work_pct,
    r.j_tokens AS tokens, r.j_samples AS samples,
    if(r.j_allocated_gpu_h > 0, r.j_tokens / r.j_allocated_gpu_h, NULL) AS tokens_per_gpu_h,
    if(r.j_allocated_gpu_h > 0, r.j_samples / r.j_allocated_gpu_h, NULL) AS samples_per_gpu_h,
    r.j_energy_kwh AS energy_kwh,
    if(r.j_tokens > 0, r.j_energy_kwh / (r.j_tokens / 1e9), NULL) AS kwh_per_billion_tokens,
    if(r.j_productive_gpu_s > 0, r.j_tokens / r.j_productive_gpu_s, NULL) AS tokens_per_gpu_s,
    if(r.j_node_count > 1 AND r.j_family_tokens_per_gpu_s > 0 AND r.j_productive_gpu_s > 0,
       (r.j_tokens / r.j_productive_gpu_s) / r.j_family_tokens_per_gpu_s, NULL) AS scaling_efficiency{runs_column}
FROM ids AS i
LEFT JOIN job_runs AS r ON i.job_id = r.job_id
LEFT JOIN states AS st ON i.job_id = st.job_id
LEFT JOIN queue AS q ON i.job_id = q.job_id"""
