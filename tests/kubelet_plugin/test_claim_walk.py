"""A newcomer following one claim from NodePrepareResources to its CDI file reads at most 8 of the node
daemon's files (docs/architecture.md walks them). Kubernetes' example driver needs 4; before the
kubelet-side seam, gpuready's walk entered 17 (22 with the shared core).

The walk is measured, not listed by hand: every function the gRPC handler thread enters is traced
during one real NodePrepareResources over the DRA socket, for a whole-GPU claim with no
configuration. A new helper module on the prepare path fails this test; merge it into the module
that owns the step, or give the step its own seam.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Any

import pytest

from testbed.plugin_harness import PluginHarness

NODE = "walk-node"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + os.sep
WALK_LIMIT = 8  # kubelet_plugin files from the gRPC handler to the CDI file
# What the walk may enter: the seam, the driver, the plan, the checkpoint and the CDI spec.
EXPECTED = {
    "kubelet_plugin/kubelet/dra_service.py", "kubelet_plugin/kubelet/claims.py", "kubelet_plugin/kubelet/driver.py",
    "kubelet_plugin/prepare/preparer.py", "kubelet_plugin/prepare/claim_plan.py",
    "kubelet_plugin/checkpoint/store.py", "kubelet_plugin/checkpoint/schema.py", "kubelet_plugin/cdi/cdi_spec.py",
}


class WalkTrace:
    """Records the project files entered by gRPC handler threads while ``recording``; files entered
    after the CDI spec is written (the checkpoint commit, the latency histogram) go to ``after``."""

    def __init__(self) -> None:
        self.recording = threading.Event()
        self.before: set[str] = set()
        self.after: set[str] = set()
        self._written = False

    def __call__(self, frame: FrameType, event: str, arg: Any) -> Any:
        if event != "call" or not self.recording.is_set() or not threading.current_thread().name.startswith("grpc-"):
            return None
        path = frame.f_code.co_filename
        if not path.startswith(ROOT) or ".venv" in path:
            return None
        (self.after if self._written else self.before).add(os.path.relpath(path, ROOT))
        if frame.f_code.co_name == "write_spec" and path.endswith("prepare/preparer.py"):
            return self._on_write_spec
        return None

    def _on_write_spec(self, frame: FrameType, event: str, arg: Any) -> Any:
        if event == "return":
            self._written = True
        return self._on_write_spec


@pytest.fixture()
def traced() -> Iterator[WalkTrace]:
    trace = WalkTrace()
    threading.settrace(trace)  # every thread the plugin starts from here on (its gRPC workers)
    try:
        yield trace
    finally:
        threading.settrace(None)  # type: ignore[arg-type]


@pytest.mark.skipif(sys.gettrace() is not None, reason="a debugger or coverage tracer owns sys.settrace")
def test_one_claims_walk_from_the_grpc_handler_to_its_cdi_file_enters_at_most_8_files(traced: WalkTrace) -> None:
    with PluginHarness() as h:
        plugin = h.start_plugin(NODE, "sim:8xh100")
        gpus = sorted(n for n, d in plugin.device_index.items() if d.kind == "gpu")
        kubelet = h.kubelet(NODE)
        warm = h.create_claim("warm", [("gpu", NODE, gpus[1])])  # lazy imports and connections first
        assert kubelet.prepare([("default", "warm", warm)])[warm].ok
        uid = h.create_claim("walk", [("gpu", NODE, gpus[0])])
        traced.recording.set()
        result = kubelet.prepare([("default", "walk", uid)])[uid]
        traced.recording.clear()
        assert result.ok, result.error
        assert h.read_spec(NODE, uid)["devices"], "the CDI spec names no device"
    walk = sorted(f for f in traced.before if f.startswith("kubelet_plugin/"))
    assert len(walk) <= WALK_LIMIT, f"the walk to the CDI file enters {len(walk)} files: {walk}"
    assert set(walk) <= EXPECTED, f"unexpected files on the walk: {sorted(set(walk) - EXPECTED)}"
    # After the CDI file: the checkpoint's phase 2 and the prepare latency histogram, nothing else.
    later = sorted(f for f in traced.after - traced.before if f.startswith("kubelet_plugin/"))
    assert later == ["kubelet_plugin/metrics/plugin_metrics.py"], later
