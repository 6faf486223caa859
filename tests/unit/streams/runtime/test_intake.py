"""What the worker reads: decoding and topic checks, the time a record may move (pure)."""

from __future__ import annotations

import random
import re

import pytest

from schemas.codec import SINGLE_OBJECT_MAGIC, Codec
from schemas.errors import DecodeError
from schemas.records import Event
from schemas.topics import (
    TELEMETRY_GPU,
    TELEMETRY_HOST,
    TELEMETRY_JOB,
    TELEMETRY_UNATTRIBUTED,
    TRAINING_EVENTS,
    TRAINING_STEPS,
)
from streams.runtime.intake import align_ts, check_record, reference_ms
from streams.runtime.options import BINDINGS, TELEMETRY_BY_JOB
from tests.unit.streams.builders import gpu_sample, host_sample, job_started, rank_bound


def _bad_values(good: bytes, other_type: bytes) -> dict[str, bytes | None]:
    codec = Codec()
    step = codec.encode(step_event(0))
    unknown_fp = SINGLE_OBJECT_MAGIC + b"\x01" * 8 + step[10:]
    return {
        "no value": None,
        "empty": b"",
        "random bytes": bytes(random.Random(7).randrange(256) for _ in range(64)),
        "truncated": good[: len(good) // 2],
        "unknown fingerprint": unknown_fp,
        "trailing junk": good + b"junk",
        "wrong type": other_type,
        "900 kB": b"\xc3\x01" + good[2:10] + b"\x00" * 900_000,
    }


def step_event(ts: int) -> Event:
    return Event("StepCompleted", {"ts": ts, "job_id": "j", "rank": 0, "step": 1, "step_time_s": 1.0})


_GOOD_AND_WRONG: dict[str, tuple[Event, Event]] = {
    # topic the agent reads -> (a record that belongs there, a valid record that does not)
    TELEMETRY_GPU: (gpu_sample("j", 0, 1_000), step_event(1_000)),
    TELEMETRY_HOST: (host_sample("n1", 1_000), gpu_sample("j", 0, 1_000)),
    TRAINING_STEPS: (step_event(1_000), gpu_sample("j", 0, 1_000)),
    TRAINING_EVENTS: (rank_bound("j", 0, 1_000), step_event(1_000)),
    BINDINGS: (rank_bound("j", 0, 1_000), job_started("j", 1_000)),
    TELEMETRY_BY_JOB: (host_sample("n1", 1_000), step_event(1_000)),
    TELEMETRY_UNATTRIBUTED: (gpu_sample("n1", 0, 1_000), step_event(1_000)),
    TELEMETRY_JOB: (host_sample("n1", 1_000), rank_bound("j", 0, 1_000)),
}


@pytest.mark.parametrize("topic", sorted(_GOOD_AND_WRONG))
def test_every_kind_of_bad_input_on_every_worker_topic_is_one_decode_error(topic: str) -> None:
    """bind, route and detect all read through `check_record`, and catch exactly DecodeError."""
    codec = Codec()
    good, wrong = _GOOD_AND_WRONG[topic]
    assert check_record(codec, codec.encode(good), topic).type == good.type
    for kind, value in _bad_values(codec.encode(good), codec.encode(wrong)).items():
        with pytest.raises(DecodeError):
            check_record(codec, value, topic)
        if kind == "wrong type":
            with pytest.raises(DecodeError, match=re.escape(f"does not belong on {topic}")):
                check_record(codec, value, topic)


def test_a_prefixed_topic_follows_the_same_contract() -> None:
    codec = Codec()
    with pytest.raises(DecodeError, match=r"does not belong on rs\.telemetry\.gpu"):
        check_record(codec, codec.encode(step_event(1)), "t1a2b.rs.telemetry.gpu")
    assert check_record(codec, codec.encode(step_event(1)), "t1a2b.rs.training.steps").type == "StepCompleted"


def test_a_record_the_engine_will_reject_for_its_time_moves_no_event_time() -> None:
    """A record from a clock in 2199 does not count for alignment and progress at all."""
    kafka_ms = 1_780_000_000_000
    now = 1_780_000_001_000
    assert align_ts(1_780_000_000_000, kafka_ms, 300_000, now) == 1_780_000_000_000
    assert align_ts(1_780_000_300_000, kafka_ms, 300_000, now) == 1_780_000_300_000  # within the skew
    assert align_ts(7_226_582_400_000, kafka_ms, 300_000, now) is None  # year 2199
    assert align_ts(1_000, kafka_ms, 300_000, now) is None  # 1970: outside 2000..2200
    assert align_ts(1_700_000_000_000, kafka_ms, 300_000, now) == 1_700_000_000_000  # the past stays
    # A producer's CreateTime comes from its own clock: the reader's clock caps it.
    assert align_ts(7_226_582_400_000, 7_226_582_400_000, 300_000, now) is None
    assert align_ts(1_780_000_000_000, None, 300_000, now) == 1_780_000_000_000  # no timestamp: now


def test_the_reference_time_is_the_kafka_timestamp_capped_at_the_reader_clock() -> None:
    """min(Kafka timestamp, wall clock); the wall clock when the record has no timestamp."""
    now = 1_790_000_000_000
    assert reference_ms(1_780_000_000_000, now) == 1_780_000_000_000
    assert reference_ms(7_226_582_400_000, now) == now  # a producer clock in 2199: capped
    assert reference_ms(None, now) == now
    assert reference_ms(1_000, now) == now  # a 1970 Kafka timestamp is no reference either
