"""Host sampling through psutil and /proc: one `HostSample` per interval.

Throughputs (disk, network, TCP retransmits) are rates from counter deltas between two samples,
so the first sample has them null. `oom_kills` is the kernel's cumulative `oom_kill` counter from
/proc/vmstat (consumers alert on its increase); `open_files` is the allocated file handles of
/proc/sys/fs/file-nr.

InfiniBand and RoCE (`read_ib_counters`): every port under `/sys/class/infiniband/*/ports/*/`,
summed over ports, as rates or increments between two samples (null on the first one, and on a
node without InfiniBand):

- throughput: `counters/port_rcv_data` / `port_xmit_data` (4-byte words);
- errors (`ib_errors`, increments): `counters/` symbol_error, port_rcv_errors, link_downed,
  link_error_recovery, local_link_integrity_errors, excessive_buffer_overrun_errors,
  port_rcv_remote_physical_errors;
- congestion: `counters/port_xmit_wait` (ticks a port had data but no credits) per second; on
  RoCE devices `hw_counters/np_ecn_marked_roce_packets` (ECN-marked packets received) and
  `hw_counters/np_cnp_sent` + `rp_cnp_handled` (congestion notifications) per second, null where
  the device has no such counter;
- `ib_ports_down`: ports whose `state` is not ACTIVE or `phys_state` not LinkUp (now, not a delta).

A counter that went backwards (a reset, a port replaced) gives no rate for that interval.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

__all__ = [
    "HostSampler",
    "IbCounters",
    "read_file_nr",
    "read_ib_counters",
    "read_oom_kills",
    "read_tcp_retrans_segs",
]

_IB_ERRORS = (
    "symbol_error",
    "port_rcv_errors",
    "link_downed",
    "link_error_recovery",
    "local_link_integrity_errors",
    "excessive_buffer_overrun_errors",
    "port_rcv_remote_physical_errors",
)
_ECN = ("np_ecn_marked_roce_packets",)
_CNP = ("np_cnp_sent", "rp_cnp_handled")

log = logging.getLogger(__name__)


def read_tcp_retrans_segs(proc: Path) -> int | None:
    """Cumulative TCP RetransSegs from `<proc>/net/snmp`, or None where absent."""
    try:
        lines = (proc / "net" / "snmp").read_text().splitlines()
    except OSError:
        return None
    tcp = [line.split() for line in lines if line.startswith("Tcp:")]
    if len(tcp) < 2:
        return None
    header, values = tcp[0], tcp[1]
    try:
        return int(values[header.index("RetransSegs")])
    except (ValueError, IndexError):
        return None


def read_file_nr(proc: Path) -> int | None:
    """Allocated file handles, the first number of `<proc>/sys/fs/file-nr`."""
    try:
        return int((proc / "sys" / "fs" / "file-nr").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def read_oom_kills(proc: Path) -> int | None:
    """The kernel's cumulative `oom_kill` count from `<proc>/vmstat` (Linux 4.13+)."""
    try:
        for line in (proc / "vmstat").read_text().splitlines():
            if line.startswith("oom_kill "):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


@dataclass(frozen=True)
class IbCounters:
    """Cumulative InfiniBand / RoCE counters summed over a node's ports (None: no port has that counter)."""

    rx_bytes: int
    tx_bytes: int
    errors: int
    xmit_wait: int | None
    ecn_marked: int | None
    cnp: int | None
    ports: int
    ports_down: int


def _counter(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _sum(values: list[int | None]) -> int | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def _port_down(port: Path) -> bool:
    """`state` is e.g. "4: ACTIVE", `phys_state` "5: LinkUp"; a port that says neither is down."""
    try:
        state = (port / "state").read_text()
    except OSError:
        return False  # no state file: nothing to judge
    try:
        phys = (port / "phys_state").read_text()
    except OSError:
        phys = "LinkUp"
    return "ACTIVE" not in state or "LinkUp" not in phys


def read_ib_counters(sys_root: Path) -> IbCounters | None:
    """The node's InfiniBand / RoCE counters summed over every port, or None without any port."""
    ports = sorted((sys_root / "class" / "infiniband").glob("*/ports/*"))
    ports = [p for p in ports if (p / "counters").is_dir()]
    if not ports:
        return None
    rx = tx = errors = down = 0
    waits: list[int | None] = []
    ecn: list[int | None] = []
    cnp: list[int | None] = []
    for port in ports:
        counters, hw = port / "counters", port / "hw_counters"
        rx += (_counter(counters / "port_rcv_data") or 0) * 4
        tx += (_counter(counters / "port_xmit_data") or 0) * 4
        errors += sum(_counter(counters / name) or 0 for name in _IB_ERRORS)
        waits.append(_counter(counters / "port_xmit_wait"))
        ecn.extend(_counter(hw / name) for name in _ECN)
        cnp.extend(_counter(hw / name) for name in _CNP)
        down += _port_down(port)
    return IbCounters(rx, tx, errors, _sum(waits), _sum(ecn), _sum(cnp), len(ports), down)


class HostSampler:
    """Samples the host; `sample(ts_ms, now_s)` -> a HostSample record. `now_s` is a monotonic clock."""

    def __init__(
        self,
        *,
        cluster: str,
        node: str,
        proc_root: str | Path = "/proc",
        sys_root: str | Path = "/sys",
        ps: Any = psutil,
    ) -> None:
        self.cluster = cluster
        self.node = node
        self.proc = Path(proc_root)
        self.sys = Path(sys_root)
        self._ib_errors_prev: int | None = None
        self.ps = ps
        self._prev: dict[str, tuple[float, float]] = {}
        ps.cpu_percent(interval=None)  # the first call only primes the counter

    def _rate(self, name: str, value: float | None, now_s: float) -> float | None:
        if value is None:
            return None
        prev = self._prev.get(name)
        self._prev[name] = (value, now_s)
        if prev is None or now_s <= prev[1] or value < prev[0]:
            return None  # first sample, or a counter reset
        return (value - prev[0]) / (now_s - prev[1])

    def sample(self, ts_ms: int, now_s: float) -> dict[str, Any]:
        """One HostSample record; a value that cannot be read is null."""
        ps = self.ps
        try:
            load1, load5, load15 = os.getloadavg()
        except OSError:
            load1 = load5 = load15 = None  # type: ignore[assignment]
        vm = ps.virtual_memory()
        try:
            swap_used: int | None = int(ps.swap_memory().used)
        except (OSError, RuntimeError):
            swap_used = None
        disk = ps.disk_io_counters()
        net = ps.net_io_counters()
        ib = read_ib_counters(self.sys)
        ib_errors: int | None = None
        if ib is not None:
            prev, self._ib_errors_prev = self._ib_errors_prev, ib.errors
            ib_errors = None if prev is None or ib.errors < prev else ib.errors - prev
        return {
            "ts": ts_ms,
            "cluster": self.cluster,
            "node": self.node,
            "cpu_util_pct": float(ps.cpu_percent(interval=None)),
            "load1": load1,
            "load5": load5,
            "load15": load15,
            "mem_used_bytes": int(vm.used),
            "mem_available_bytes": int(vm.available),
            "mem_total_bytes": int(vm.total),
            "swap_used_bytes": swap_used,
            "disk_read_bytes_s": self._rate("disk_read", None if disk is None else disk.read_bytes, now_s),
            "disk_write_bytes_s": self._rate("disk_write", None if disk is None else disk.write_bytes, now_s),
            "net_rx_bytes_s": self._rate("net_rx", None if net is None else net.bytes_recv, now_s),
            "net_tx_bytes_s": self._rate("net_tx", None if net is None else net.bytes_sent, now_s),
            "tcp_retrans_segs_s": self._rate("retrans", read_tcp_retrans_segs(self.proc), now_s),
            "open_files": read_file_nr(self.proc),
            "oom_kills": read_oom_kills(self.proc),
            "job_ids": [],  # stamped by the runner from the jobs attributed on this node
            "ib_rx_bytes_s": self._rate("ib_rx", None if ib is None else ib.rx_bytes, now_s),
            "ib_tx_bytes_s": self._rate("ib_tx", None if ib is None else ib.tx_bytes, now_s),
            "ib_errors": ib_errors,
            "ib_xmit_wait_s": self._rate("ib_wait", None if ib is None else ib.xmit_wait, now_s),
            "ib_ecn_marked_s": self._rate("ib_ecn", None if ib is None else ib.ecn_marked, now_s),
            "ib_cnp_s": self._rate("ib_cnp", None if ib is None else ib.cnp, now_s),
            "ib_ports_down": None if ib is None else ib.ports_down,
        }
