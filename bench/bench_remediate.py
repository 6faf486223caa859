"""How fast `ranksight remediate` rebuilds job state from rs.training.events, with and without its header filter.

    .venv/bin/python bench/bench_remediate.py [--scenario mixed] [--seed 0] [--repeat 3]

The training events of a simulated scenario are encoded as Kafka values (single-object framing,
as producers publish them) and fed to the remediator's rebuild path twice: decoding every record
(the baseline, what it did before the filter), then skipping the types it never reads (steps,
data-loader and collective samples, RankBound, ...) by their fingerprint before decoding. Both must
leave the same job facts; the events/s of each are printed side by side, measured in the same run.
No broker: this times the CPU work per record, which bounds the rebuild over days of events.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from producers.simulator import load_scenario, simulate
from schemas.codec import Codec
from schemas.topics import TRAINING_EVENTS, TRAINING_STEPS, topic_for
from streams.alerting.remediation import RemediationPolicy, Remediator
from streams.alerting.remediation_loop import event_filter

POLICY = RemediationPolicy.from_dict({"rules": {"zombie_job": {"action": "cancel", "min_firing_s": 0}}})


def _rebuild(
    values: list[bytes], codec: Codec, wanted: Callable[[bytes | None], bool]
) -> tuple[float, Remediator]:
    remediator = Remediator(POLICY, lookup=lambda job_id: None)  # the rebuild asks no scheduler
    began = time.perf_counter()
    for value in values:
        if wanted(value):
            remediator.observe_event(codec.decode(value))
    return time.perf_counter() - began, remediator


def main() -> None:
    """Simulate, encode, time both rebuilds, print events/s."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", default="mixed")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    codec = Codec()
    sim = simulate(load_scenario(args.scenario), args.seed)
    # What the events topic holds, plus steps: remediate reads rs.training.events only, but a
    # deployment that puts both on one topic (or a replay of both) shows the filter's upper bound.
    events = [e for e in sim.events() if topic_for(e.type) in (TRAINING_EVENTS, TRAINING_STEPS)]
    on_events = [codec.encode(e) for e in events if topic_for(e.type) == TRAINING_EVENTS]
    with_steps = [codec.encode(e) for e in events]
    print(f"scenario {args.scenario} seed {args.seed}: {len(on_events):,} rs.training.events records")
    for name, values in (("rs.training.events", on_events), ("events + steps", with_steps)):
        full = min(_rebuild(values, codec, lambda v: True)[0] for _ in range(args.repeat))
        filtered_s, filtered = min(
            (_rebuild(values, codec, event_filter(codec)) for _ in range(args.repeat)), key=lambda r: r[0]
        )
        _, reference = _rebuild(values, codec, lambda v: True)
        same = {j: vars(f) for j, f in filtered.jobs.items()} == {
            j: vars(f) for j, f in reference.jobs.items()
        }
        print(
            f"  {name:<20} {len(values):>9,} records: decode all {len(values) / full:>10,.0f} ev/s (baseline), "
            f"header filter {len(values) / filtered_s:>10,.0f} ev/s ({full / filtered_s:.1f}x); same job facts: {same}"
        )


if __name__ == "__main__":
    main()
