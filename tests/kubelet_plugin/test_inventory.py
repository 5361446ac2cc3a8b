"""The node inventory: one owner of the node's device view.

What its readers rely on: a re-read keeps a GPU that fell off the bus (unhealthy, never forgotten);
subscribers hear of each new node in order, and only of a new node or prerequisite (never of a
withheld-set change, which follows health and would loop back); a dynamic MIG change re-reads the node
on the inventory's own thread, and a failed re-read is tried again until one succeeds.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from dra_driver.devices import NodeDevices
from kubelet_plugin.inventory import NodeInventory, NodeView
from kubelet_plugin.nvml import discover
from testbed.nvml_sim import SimulatedNvml


def _wait(what: str, check: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"{what}: not within {timeout}s"
        time.sleep(0.02)


def test_a_gpu_off_the_bus_stays_in_the_view_and_subscribers_hear_of_each_new_node() -> None:
    sim = SimulatedNvml("8xh100")
    inventory = NodeInventory(sim, dynamic_mig=False, node="n1")
    heard: list[tuple[NodeView, NodeView]] = []
    inventory.subscribe("recorder", lambda previous, view: heard.append((previous, view)))
    first = inventory.refresh()
    assert not heard  # the first read is no change
    assert len(first.devices.gpus) == 8 and "gpu-3" in first.index

    sim.faults.fall_off_bus(3)
    view = inventory.refresh()
    assert [g.name for g in view.lost] == ["gpu-3"]
    assert "gpu-3" in view.index and len(view.devices.gpus) == 8  # kept, to be reported unhealthy
    assert len(heard) == 1 and heard[0] == (first, view)

    sim.faults.return_to_bus(3)
    back = inventory.refresh()
    assert back.lost == () and len(heard) == 2 and heard[1][1] is back


def test_the_withheld_set_reaches_readers_but_no_subscriber_and_a_prerequisite_reaches_both() -> None:
    inventory = NodeInventory(SimulatedNvml("8xh100"), dynamic_mig=False, node="n1")
    inventory.refresh()
    heard: list[NodeView] = []
    inventory.subscribe("recorder", lambda previous, view: heard.append(view))
    inventory.withhold({"gpu-1": "XID 79"}, refuse=False)
    view = inventory.current()
    assert view.withheld == {"gpu-1": "XID 79"} and view.refuse_withheld is False
    assert not heard  # health already told everyone: telling them again would loop back into health

    problem = ("CDIRootUnusable", "--cdi-root /proc/cdi (env CDI_ROOT): read-only file system")
    inventory.set_prerequisite(problem)
    inventory.set_prerequisite(problem)  # the same again: nothing new
    assert [v.prerequisite for v in heard] == [problem]
    assert heard[0].withheld == {"gpu-1": "XID 79"}  # one view: nothing else lost on the way
    inventory.set_prerequisite(None)
    assert [v.prerequisite for v in heard] == [problem, None]


def test_a_mig_change_is_re_read_on_the_refresh_thread_and_a_failed_read_is_retried() -> None:
    sim = SimulatedNvml("4xh200")
    reads: list[float] = []
    fail = threading.Event()

    def read(nvml: Any) -> NodeDevices:
        reads.append(time.monotonic())
        if fail.is_set():
            fail.clear()
            raise RuntimeError("NVML busy")
        return discover(nvml)

    inventory = NodeInventory(sim, dynamic_mig=True, node="n1", discover=read)
    inventory.refresh()
    heard: list[NodeView] = []
    inventory.subscribe("recorder", lambda previous, view: heard.append(view))
    inventory.start()
    try:
        fail.set()
        inventory.stale.set()  # what a MIG create or destroy does on the prepare path: nothing more
        _wait("the re-read after the failed one", lambda: len(reads) >= 3 and heard)
        assert inventory.dead_threads() == [] and not inventory.stale.is_set()  # read, nothing left to read
    finally:
        inventory.stop()
