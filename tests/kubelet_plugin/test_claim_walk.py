"""A newcomer following a claim or a fault through the node daemon reads few files, and few twice.

Each walk is measured, not listed by hand: every function of the node daemon (``kubelet_plugin/``)
that the walking thread enters is traced, call and return, and the files where its code runs are
written down in order. A *stay* is a run of code in one file; a *return* is a stay in a file the
walk had already left (a call into a helper and back counts one). Kubernetes' example driver's
whole-GPU prepare: 13 stays, 7 returns.

- A whole-GPU claim, from ``NodePrepareResources`` to its CDI file (the gRPC handler thread).
  Before the node inventory: 8 files, 34 stays, 26 returns; then 8 files, 18 stays, 10 returns (the
  checkpoint read once, under the claim's lock; the claim read only when no answer is recorded); now
  7 files, 16 stays, 9 returns: the claim's CDI spec is computed and written in one call into
  ``cdi/cdi_spec.py``, which holds both the spec's content and its file (``cdi/spec_files.py`` was the
  second file, entered after a turn back in the preparer).
- A dynamic-MIG claim, the same way: its instance is created on the gRPC thread, and the node is
  re-read off it (the inventory's refresh thread), never through ``daemon.py``. Before the inventory:
  18 files (``daemon.py`` among them, re-discovering the node under the claim's lock); then 13 files,
  46 stays, 33 returns (the instance read back through four ``nvml/`` files), then 11 files, 38 stays,
  27 returns; now 10 files, 36 stays, 26 returns: the walk above, the MIG step
  (``prepare/mig_instances.py``), NVML's create under the MIG gate (``nvml/mig_lifecycle.py``) and the
  one MIG device reader discovery also uses (``nvml/discovery.py``, which names the instance's
  ``/dev/nvidia-caps`` nodes itself). On a real node ``nvml/host_info.py`` is entered too
  (``SysfsHost`` reads the capability minors from ``/proc``; the simulated NVML answers that itself).
- One XID 79, from NVML's event to the republished slice (the health monitor's event thread, up to
  the publisher's ``set_desired``), the metrics subscriber first. Before: 11 files, 24 stays, 13
  returns; now 8 files, 20 stays, 12 returns: what the event means (its GPU, the devices it concerns,
  whether its XID withdraws them) is one pure call into one module (``health/xid.py``'s
  ``decode_event``, where ``events.py``, ``xid.py`` and ``topology.py`` each took a turn), and the
  snapshot lives with the state machine it reads out (``health/state.py``, no longer ``snapshot.py``).

Each limit is today's walk: a new module or a new hop on one of these paths fails its test; merge
it into the module that owns the step, or give the step its own seam.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

import pytest

from testbed.plugin_harness import PluginHarness

NODE = "walk-node"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + os.sep


@dataclass
class Walk:
    """The node files where a thread's code ran, in order (consecutive runs in one file merged)."""

    stays: list[str] = field(default_factory=list)

    @property
    def files(self) -> set[str]:
        """Every node file the walk entered."""
        return set(self.stays)

    @property
    def returns(self) -> int:
        """Stays in a file the walk had already left."""
        return len(self.stays) - len(self.files)


class WalkTrace:
    """Traces the node files entered by threads whose name starts with ``thread_prefix`` while
    ``recording``, until a function named ``until`` (in a file ending ``until_file``) returns."""

    def __init__(self, thread_prefix: str, until: str, until_file: str) -> None:
        self.recording = threading.Event()
        self.walk = Walk()
        self._prefix, self._until, self._until_file = thread_prefix, until, until_file
        self._stack: list[str] = []
        self._done = False

    def _at(self, path: str) -> None:
        if not self.walk.stays or self.walk.stays[-1] != path:
            self.walk.stays.append(path)

    def __call__(self, frame: FrameType, event: str, arg: Any) -> Any:
        if (event != "call" or self._done or not self.recording.is_set()
                or not threading.current_thread().name.startswith(self._prefix)):
            return None
        path = frame.f_code.co_filename
        if not path.startswith(ROOT) or ".venv" in path:
            return None
        rel = os.path.relpath(path, ROOT)
        if not rel.startswith("kubelet_plugin/"):
            return None
        self._stack.append(rel)
        self._at(rel)
        name = frame.f_code.co_name
        return lambda f, e, a: self._on_return(f, e, name, rel)

    def _on_return(self, frame: FrameType, event: str, name: str, rel: str) -> Any:
        if event != "return" or self._done:
            return None if self._done else (lambda f, e, a: self._on_return(f, e, name, rel))
        if self._stack:
            self._stack.pop()
        if name == self._until and rel.endswith(self._until_file):
            self._done = True
            return None
        if self._stack:
            self._at(self._stack[-1])
        return None


@pytest.fixture()
def settrace() -> Iterator[Any]:
    def install(trace: WalkTrace) -> None:
        threading.settrace(trace)  # every thread the plugin starts from here on

    yield install
    threading.settrace(None)  # type: ignore[arg-type]


needs_tracer = pytest.mark.skipif(sys.gettrace() is not None,
                                  reason="a debugger or coverage tracer owns sys.settrace")


def _prepare_walk(settrace: Any, profile: str, pick: str, **overrides: Any) -> Walk:
    trace = WalkTrace("grpc-", "write_spec", "prepare/preparer.py")
    settrace(trace)
    with PluginHarness() as h:
        plugin = h.start_plugin(NODE, profile, **overrides)
        names = sorted(n for n, d in plugin.inventory.current().index.items() if d.kind.name == pick)
        kubelet = h.kubelet(NODE)
        warm = h.create_claim("warm", [("gpu", NODE, names[-1])])  # lazy imports and connections first
        assert kubelet.prepare([("default", "warm", warm)])[warm].ok
        uid = h.create_claim("walk", [("gpu", NODE, names[0])])
        trace.recording.set()
        result = kubelet.prepare([("default", "walk", uid)])[uid]
        trace.recording.clear()
        assert result.ok, result.error
        assert h.read_spec(NODE, uid)["devices"], "the CDI spec names no device"
    return trace.walk


@needs_tracer
def test_a_whole_gpu_claims_walk_to_its_cdi_file(settrace: Any) -> None:
    walk = _prepare_walk(settrace, "sim:8xh100", "gpu")
    assert len(walk.files) <= 7, f"the walk enters {len(walk.files)} files: {sorted(walk.files)}"
    assert walk.returns <= 9, f"{walk.returns} returns: {walk.stays}"
    assert "kubelet_plugin/daemon.py" not in walk.files


@needs_tracer
def test_a_dynamic_mig_claims_walk_never_climbs_into_the_daemon(settrace: Any) -> None:
    walk = _prepare_walk(settrace, "sim:4xh200", "placement", mig_mode="dynamic")
    assert "kubelet_plugin/daemon.py" not in walk.files, walk.stays
    assert "kubelet_plugin/inventory.py" not in walk.files, "the node is re-read on the prepare path"
    assert len(walk.files) <= 10, f"the walk enters {len(walk.files)} files: {sorted(walk.files)}"
    assert walk.returns <= 26, f"{walk.returns} returns: {walk.stays}"


@needs_tracer
def test_one_xids_walk_to_the_republished_slice(settrace: Any) -> None:
    trace = WalkTrace("health-events", "set_desired", "kubelet/slice_publisher.py")
    settrace(trace)
    with PluginHarness() as h:
        plugin = h.start_plugin(NODE, "sim:8xh100", health_mode="withdraw")
        assert plugin.health_monitor is not None and plugin.health_monitor.wait_validated(30)
        trace.recording.set()
        plugin.nvml.faults.inject_xid(0, 79)
        deadline = time.monotonic() + 20
        while "gpu-0" in h.published_devices(NODE):
            assert time.monotonic() < deadline, "gpu-0 was not withdrawn"
            time.sleep(0.05)
        trace.recording.clear()
    walk = trace.walk
    assert "kubelet_plugin/kubelet/slice_publisher.py" in walk.files, walk.stays
    assert "kubelet_plugin/daemon.py" not in walk.files
    assert len(walk.files) <= 8, f"the walk enters {len(walk.files)} files: {sorted(walk.files)}"
    assert walk.returns <= 12, f"{walk.returns} returns: {walk.stays}"
