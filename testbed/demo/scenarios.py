"""The scripted faults of ``gpuready demo --scenario``: what breaks, how NVML shows it, what must happen.

Each fault is injected through the simulated NVML exactly as the real library would show it (an
XID event, ``GPU_IS_LOST`` from every call, pending row remaps); the plugin's health monitor finds
it by itself. ``clear`` is what a GPU reset does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Scenario:
    """One fault: how to cause it, whether it withdraws the device, and the story's words for it."""

    name: str
    title: str
    explanation: str
    inject: Callable[[Any, int], None]  # (simulated NVML, GPU index)
    withdraws: bool
    detection: str  # how the monitor finds it


def _xid(code: int) -> Callable[[Any, int], None]:
    def inject(nvml: Any, index: int) -> None:
        nvml.faults.inject_xid(index, code)
    return inject


def _gpu_lost(nvml: Any, index: int) -> None:
    nvml.faults.gpu_lost(index)


def _off_the_bus(nvml: Any, index: int) -> None:
    # XID 79 is not a one-off: the GPU stays off the bus (GPU_IS_LOST from every call) until it is
    # reset. Without the lasting loss a passing probe would start recovery by itself. Both at once,
    # as the driver reports them: injected one after the other, a story thread that lost the CPU in
    # between let the plugin take the XID, probe the GPU (still answering), pass it and begin
    # recovery (GPUReady said Recovering on a loaded machine). Whichever the monitor sees first, the
    # event or the loss on its next poll, names the fault.
    with nvml.faults.together():
        nvml.faults.inject_xid(index, 79)
        nvml.faults.gpu_lost(index)


def _row_remap(nvml: Any, index: int) -> None:
    nvml.faults.row_remap_pending(index)


SCENARIOS: dict[str, Scenario] = {s.name: s for s in (
    Scenario("xid79", "XID 79: the GPU falls off the bus",
             "The driver reports XID 79 (GPU has fallen off the bus). It needs a reset: the device must "
             "leave the cluster at once, so no new pod lands on it.",
             _off_the_bus, True, "NVML XID event"),
    Scenario("gpu-lost", "GPU lost: NVML answers GPU_IS_LOST",
             "Every NVML call on the GPU now fails with GPU_IS_LOST, while the node itself stays Ready. "
             "The plugin's poll finds it and withdraws the device.",
             _gpu_lost, True, "NVML poll"),
    Scenario("xid13", "XID 13: an application error (the device stays)",
             "XID 13 (graphics engine exception) is caused by the application, not the GPU: the XID "
             "catalogue says restart the app. The device must stay published (with --xid-fatal 13 it "
             "would be withdrawn).",
             _xid(13), False, "NVML XID event"),
    Scenario("row-remap", "Row remapping pending after an uncorrectable memory error",
             "The GPU found an uncorrectable memory error and needs a row remap, applied at the next "
             "reset. Until then new work may hit the bad row: the device is withdrawn.",
             _row_remap, True, "NVML poll"),
)}

DEFAULT = "xid79"
