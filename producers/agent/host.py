"""Host sampling through psutil and /proc: one `HostSample` per interval.

Throughputs (disk, network, TCP retransmits) are rates from counter deltas between two samples,
so the first sample has them null. `oom_kills` is the kernel's cumulative `oom_kill` counter from
/proc/vmstat (consumers alert on its increase); `open_files` is the allocated file handles of
/proc/sys/fs/file-nr. InfiniBand: port counters under `/sys/class/infiniband/*/ports/*/counters`
(`port_rcv_data` / `port_xmit_data` count 4-byte words), summed over ports; `ib_errors` is the
increase of the error counters during the interval; all null on a node without InfiniBand.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import psutil

__all__ = ["HostSampler", "read_file_nr", "read_ib_counters", "read_oom_kills", "read_tcp_retrans_segs"]

_IB_ERRORS = ("symbol_error", "port_rcv_errors", "link_downed", "link_error_recovery")

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


def read_ib_counters(sys_root: Path) -> tuple[int, int, int] | None:
    """(received bytes, transmitted bytes, errors) summed over every InfiniBand port, or None without any."""
    ports = sorted((sys_root / "class" / "infiniband").glob("*/ports/*/counters"))
    if not ports:
        return None
    rx = tx = errors = 0
    for counters in ports:
        try:
            rx += int((counters / "port_rcv_data").read_text()) * 4
            tx += int((counters / "port_xmit_data").read_text()) * 4
        except (OSError, ValueError):
            continue
        for name in _IB_ERRORS:
            try:
                errors += int((counters / name).read_text())
            except (OSError, ValueError):
                continue
    return rx, tx, errors


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
            prev, self._ib_errors_prev = self._ib_errors_prev, ib[2]
            ib_errors = None if prev is None or ib[2] < prev else ib[2] - prev
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
            "ib_rx_bytes_s": self._rate("ib_rx", None if ib is None else ib[0], now_s),
            "ib_tx_bytes_s": self._rate("ib_tx", None if ib is None else ib[1], now_s),
            "ib_errors": ib_errors,
        }
