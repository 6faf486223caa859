"""The node agent: GPU telemetry through NVML, host telemetry through psutil, published per interval."""

from producers.agent.fake_nvml import FakeDevice, FakeNvml
from producers.agent.gpu import GpuSampler, XidWatcher, load_nvml
from producers.agent.host import HostSampler
from producers.agent.runner import Agent, AgentStats, next_tick

__all__ = [
    "Agent",
    "AgentStats",
    "FakeDevice",
    "FakeNvml",
    "GpuSampler",
    "HostSampler",
    "XidWatcher",
    "load_nvml",
    "next_tick",
]
