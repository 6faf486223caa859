"""Where a record, a copy, a marker goes: one answer for the worker and the offline replay alike.

Detection runs in two stages over `partitions` partitions (issue 19). Which partition's rank stage
reads a record, which partitions get a copy of it (a job's start and state, a GPU fault shared with
the node's other jobs), where the rank stage's output and a learned baseline go: each is decided
here once. The worker (`streams.runtime`) turns the answers into Kafka sends; the offline replay
(`streams.offline.detection`) hands the records to its in-memory stages. Pure: no Kafka, no clock.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any, Generic, TypeVar

from schemas.records import Event
from schemas.topics import TELEMETRY_JOB, key_for, partition_for, shard_key, telemetry_copies, topic_for
from streams.stages.routes import NodeRoutes, gpu_fault

__all__ = ["BROADCAST", "FaultCopies", "Holder", "Placement", "is_shared", "shared_key"]

T = TypeVar("T")

# Job-level records every rank-stage partition needs a copy of (its rules need the job's identity
# and state), besides the one the job's own partition reads.
BROADCAST = frozenset({"JobStarted", "JobStateChanged"})

# Key of a GPU fault sent on to a co-located job's partition (the partition is chosen explicitly):
# a key no job's records have, so that job's task knows the GPU is another job's.
_SHARED = "\x00shared\x00"


def shared_key(key: str) -> str:
    """The key of a shared GPU fault sent to the partition `key` lands on."""
    return _SHARED + key


def is_shared(key: bytes | None) -> bool:
    """Whether a re-keyed telemetry record is a GPU fault shared with a co-located job."""
    return (key or b"").startswith(_SHARED.encode())


class Holder:
    """Whether one partition holds a job's records from a node (`shard_key`): the rank stage that
    reports a node-level fault for that job, when every partition with a job on the node sees it."""

    def __init__(self, partition: int, partitions: int) -> None:
        self.partition, self.partitions = partition, partitions

    def __call__(self, job_id: str, node: str | None) -> bool:
        return partition_for(shard_key(job_id, node).encode(), self.partitions) == self.partition


class Placement:
    """The partition of every record and copy, for `partitions` partitions of every stage topic."""

    def __init__(self, partitions: int) -> None:
        self.partitions = partitions

    def of(self, key: str) -> int:
        """The partition a key lands on (the Java client's partitioner)."""
        return partition_for(key.encode(), self.partitions)

    def job(self, job_id: Any) -> int:
        """The job stage's partition of a job: what the rank stages pass on about it, its job-level
        records, the runs its baselines learn."""
        return self.of(str(job_id or ""))

    def node(self, node: Any) -> int:
        """The side path's partition of a node: its bindings, its routes, its GPU faults to share."""
        return self.of(str(node))

    def source(self, event: Event) -> list[int]:
        """The rank-stage partitions a record's published copies land on (training records by job
        and node, attributed telemetry by its job and node); empty for telemetry keyed by node,
        which goes through the side path (`routed`)."""
        if event.type in ("GpuSample", "HostSample"):
            copies = telemetry_copies(event.type, event.record)
            return sorted({self.of(key.decode()) for topic, key in copies if topic == TELEMETRY_JOB})
        topic = topic_for(event.type)
        return [self.of((key_for(topic, event.record) or b"").decode())]

    def copies(self, event: Event, read_on: int) -> list[int]:
        """The other rank-stage partitions a job-level record read on `read_on` is copied to."""
        if event.type not in BROADCAST:
            return []
        return [q for q in range(self.partitions) if q != read_on]

    def routed(self, routes: NodeRoutes, event: Event) -> dict[int, str]:
        """Unattributed telemetry: partition -> job key of each job it goes to (`NodeRoutes.route`:
        empty when thinned). Call once per sample: the thinning remembers it."""
        parts: dict[int, str] = {}
        for key in routes.route(event):
            parts.setdefault(self.of(key), key)
        return parts

    def shared(self, routes: NodeRoutes, event: Event, own: Collection[int]) -> dict[int, str]:
        """A GPU fault: partition -> shared key of each co-located job's partition it goes on to,
        besides `own` (the partitions that read the sample itself)."""
        parts: dict[int, str] = {}
        for key in routes.colocated(event):
            part = self.of(key)
            if part not in own:
                parts.setdefault(part, shared_key(key))
        return parts

    def others(self, partition: int) -> list[int]:
        """Every job-stage partition but `partition`: where a run one partition's baselines learned goes."""
        return [q for q in range(self.partitions) if q != partition]

    def every(self) -> range:
        """Every partition: where a rank stage's progress marker goes (each job stage waits on all
        of them), and a job's end (its routes are kept where its nodes' bindings are)."""
        return range(self.partitions)

    def holder(self, partition: int) -> Holder:
        """Whether rank-stage `partition` holds a job's records from a node."""
        return Holder(partition, self.partitions)


class FaultCopies(Generic[T]):
    """The last healthy sample of each GPU, sent along before its first fault copy: an ECC error is
    a counter going up between two samples, which a co-located job's engine has not seen."""

    def __init__(self) -> None:
        self.before: dict[str, T] = {}  # "node|gpu_uuid" -> its last healthy sample

    def copies(self, record: dict[str, Any], sample: T) -> list[T]:
        """The samples to share for this GpuSample (`record` is its content): none for a healthy
        one (remembered instead), else the GPU's last healthy sample (once) and this one."""
        gpu = f"{record['node']}|{record.get('gpu_uuid')}"
        if not gpu_fault(record):
            self.before[gpu] = sample
            return []
        before = self.before.pop(gpu, None)
        return [sample] if before is None else [before, sample]

    def clear(self) -> None:
        self.before.clear()
