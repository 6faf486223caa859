"""What kind of rank fault an exception is: CUDA out of memory, a dependency timeout, or a plain exception.

The training process must not import torch for ranksight (a CPU-only tool, or a loop that has not
touched CUDA yet), so exceptions are recognised by their class names along the MRO and their
messages: `torch.cuda.OutOfMemoryError` (and the `RuntimeError: CUDA out of memory` of torch
before 1.13), torch.distributed's collective and store timeouts, and timeouts of I/O (a
`TimeoutError`, `socket.timeout`, an `OSError` with ETIMEDOUT, object-store clients' timeout
errors), which are storage timeouts.
"""

from __future__ import annotations

import errno

__all__ = ["FAULT_KINDS", "fault_detail", "fault_kind"]

FAULT_KINDS: tuple[str, ...] = (
    "exception",
    "exit",
    "cuda_oom",
    "oom",
    "collective_timeout",
    "storage_timeout",
    "nan",
    "other",
)

# Phrases torch.distributed and NCCL use when a collective or the rendezvous store timed out.
_COLLECTIVE_PHRASES = (
    "watchdog caught collective operation timeout",
    "collective operation timeout",
    "nccl timeout",
    "timed out in store",
    "socket timeout",
    "wait timeout",
    "barrier timed out",
)
_DIST_MODULES = ("torch.distributed", "torch._C._distributed")


def _names(exc: BaseException) -> list[tuple[str, str]]:
    return [(cls.__module__ or "", cls.__name__) for cls in type(exc).__mro__]


def _is_cuda_oom(exc: BaseException, names: list[tuple[str, str]]) -> bool:
    if any(name == "OutOfMemoryError" and module.startswith("torch") for module, name in names):
        return True
    # torch < 1.13 raised a RuntimeError with this message.
    return isinstance(exc, RuntimeError) and "CUDA out of memory" in str(exc)


def _is_timeout(exc: BaseException, names: list[tuple[str, str]]) -> bool:
    if isinstance(exc, TimeoutError):  # socket.timeout and asyncio's are the same class
        return True
    if isinstance(exc, OSError) and exc.errno == errno.ETIMEDOUT:
        return True
    # botocore's ReadTimeoutError / ConnectTimeoutError, urllib3's, requests' Timeout, ...
    return any(name.endswith(("TimeoutError", "Timeout")) for _, name in names)


def fault_kind(exc: BaseException) -> str:
    """The RankFault kind of an exception that ended a step, the data loader or the loop."""
    names = _names(exc)
    if _is_cuda_oom(exc, names):
        return "cuda_oom"
    message = str(exc).lower()
    distributed = any(module.startswith(_DIST_MODULES) for module, _ in names) or any(
        name in ("DistBackendError", "DistStoreError", "DistNetworkError") for _, name in names
    )
    if any(p in message for p in _COLLECTIVE_PHRASES) and (
        distributed or "nccl" in message or "collective" in message
    ):
        return "collective_timeout"
    if distributed and ("timeout" in message or "timed out" in message):
        return "collective_timeout"
    if _is_timeout(exc, names):
        return "storage_timeout"
    return "exception"


def fault_detail(exc: BaseException, where: str | None = None) -> str:
    """`<where>: <Type>: <message>`, bounded: what a RankFault's detail says."""
    text = f"{type(exc).__name__}: {exc}"
    return (f"{where}: {text}" if where else text)[:2000]
