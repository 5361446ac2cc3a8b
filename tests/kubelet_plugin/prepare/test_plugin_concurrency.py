"""Concurrency: different claims in parallel, one claim never interleaved, one device never double-booked."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from kubelet_plugin.checkpoint.records import ClaimState
from kubelet_plugin.checkpoint.store import CheckpointStore
from testbed.plugin_harness import PluginHarness

NODE = "cn"


@pytest.fixture()
def h() -> Iterator[PluginHarness]:
    with PluginHarness() as harness:
        harness.start_plugin(NODE, "sim:8xh100")
        yield harness


class SlowClaims:
    """Wraps the plugin's claim source so each API read takes ``delay`` seconds."""

    def __init__(self, inner: Any, delay: float) -> None:
        self.inner, self.delay, self._get = inner, delay, inner.get

    def get(self, namespace: str, name: str, uid: str = "") -> Any:
        time.sleep(self.delay)
        return self._get(namespace, name, uid)

    def write_device_status(self, *args: Any) -> None:
        self.inner.write_device_status(*args)

    def remove_device_status(self, *args: Any) -> bool:
        return bool(self.inner.remove_device_status(*args))


class OverlapGuard:
    """Wraps a plugin's spec writes and undos so that each counts whether another wrapped call was running
    at the same time: ``overlaps`` stays 0 while the calls never interleave."""

    def __init__(self) -> None:
        self.active = 0
        self.overlaps = 0
        self.lock = threading.Lock()

    def wrap(self, fn: Any) -> Any:
        def run(*args: Any) -> Any:
            with self.lock:
                self.active += 1
                self.overlaps += self.active > 1
            time.sleep(0.005)  # widen the window an interleaving would need
            try:
                return fn(*args)
            finally:
                with self.lock:
                    self.active -= 1
        return run

    def guard(self, plugin: Any) -> None:
        plugin.preparer.write_spec = self.wrap(plugin.preparer.write_spec)
        plugin.preparer.undo = self.wrap(plugin.preparer.undo)


def _hammer(kubelet_for: Callable[[int], Any], name: str, uid: str, calls: int, threads: int) -> list[str]:
    """``calls`` prepares (even i) and unprepares (odd i) of one claim from ``threads`` threads, call i
    through ``kubelet_for(i)``; their errors ("" for success)."""

    def call(i: int) -> str:
        kubelet = kubelet_for(i)
        if i % 2:
            return str(kubelet.unprepare([("default", name, uid)])[uid])
        return str(kubelet.prepare([("default", name, uid)])[uid].error)

    with ThreadPoolExecutor(threads) as pool:
        return list(pool.map(call, range(calls)))


def test_many_claims_prepare_in_parallel_and_the_checkpoint_stays_whole(h: PluginHarness) -> None:
    plugin = h.plugins[NODE]
    names = sorted(plugin.inventory.current().index)[:16]
    claims = [(f"p{i}", h.create_claim(f"p{i}", [("gpu", NODE, dev)])) for i, dev in enumerate(names)]
    kubelet = h.kubelet(NODE)
    reader = plugin.kubelet.claim_reader()
    reader.get = SlowClaims(reader, 0.4).get  # type: ignore[method-assign]  # each claim read takes 0.4 s
    start = time.monotonic()
    with ThreadPoolExecutor(len(claims)) as pool:
        results = list(pool.map(lambda c: kubelet.prepare([("default", c[0], c[1])])[c[1]], claims))
    elapsed = time.monotonic() - start
    assert all(r.ok for r in results), [r.error for r in results if not r.ok]
    # 16 serialized API reads alone would take 6.4 s; in parallel they overlap.
    assert elapsed < 4.0, elapsed
    assert len(h.cdi_files(NODE)) == 16
    fresh = CheckpointStore(plugin.config.checkpoint_path, plugin.boot_id)
    fresh.open()
    assert fresh.quarantined is None
    assert {u for _, u in claims} == set(fresh.records())
    assert all(r.state is ClaimState.PREPARE_COMPLETED for r in fresh.records().values())
    del reader.get  # back to the class's method
    with ThreadPoolExecutor(8) as pool:
        errors = list(pool.map(lambda c: kubelet.unprepare([("default", c[0], c[1])])[c[1]], claims))
    assert errors == [""] * 16 and h.cdi_files(NODE) == []


def test_prepare_and_unprepare_of_one_claim_never_interleave(h: PluginHarness) -> None:
    plugin = h.plugins[NODE]
    uid = h.create_claim("same", [("gpu", NODE, "gpu-0")])
    kubelet = h.kubelet(NODE)
    guard = OverlapGuard()
    guard.guard(plugin)
    errors = _hammer(lambda _i: kubelet, "same", uid, calls=60, threads=12)
    assert errors == [""] * 60
    assert guard.overlaps == 0
    # Whatever order they ran in, the end state is consistent with the last call.
    assert kubelet.unprepare([("default", "same", uid)]) == {uid: ""}
    assert h.cdi_files(NODE) == [] and plugin.checkpoint.get(uid) is None


def test_two_claims_racing_for_one_device_only_one_wins(h: PluginHarness) -> None:
    kubelet = h.kubelet(NODE)
    claims = [(f"race{i}", h.create_claim(f"race{i}", [("gpu", NODE, "gpu-1")])) for i in range(6)]
    with ThreadPoolExecutor(6) as pool:
        results = list(pool.map(lambda c: kubelet.prepare([("default", c[0], c[1])])[c[1]], claims))
    winners = [r for r in results if r.ok]
    assert len(winners) == 1
    assert all("already prepared for ResourceClaim" in r.error for r in results if not r.ok)
    assert len(h.cdi_files(NODE)) == 1


def test_two_instances_of_a_rolling_update_never_interleave_one_claim() -> None:
    from kubelet_plugin.daemon import KubeletPlugin
    from kubelet_plugin.nvml import open_nvml

    with PluginHarness() as h:
        old = KubeletPlugin(h.config(NODE, pod_uid="pod-old"), h.api_client, open_nvml(f"sim:8xh100@{NODE}"))
        new = KubeletPlugin(h.config(NODE, pod_uid="pod-new"), h.api_client, open_nvml(f"sim:8xh100@{NODE}"))
        old.start()
        new.start()
        try:
            h.kubelet(NODE)  # starts the node's emulated kubelet
            emu = h.emulators[NODE]
            k_old = emu.wait_for_plugin("gpu.nvidia.com", endpoint=old.paths.dra)
            k_new = emu.wait_for_plugin("gpu.nvidia.com", endpoint=new.paths.dra)
            uid = h.create_claim("shared-claim", [("gpu", NODE, "gpu-0")])
            guard = OverlapGuard()  # one guard over both instances: their calls must not interleave either
            guard.guard(old)
            guard.guard(new)
            errors = _hammer(lambda i: k_old if i % 3 else k_new, "shared-claim", uid, calls=40, threads=8)
            assert errors == [""] * 40
            assert guard.overlaps == 0
            assert k_old.unprepare([("default", "shared-claim", uid)]) == {uid: ""}
            assert h.cdi_files(NODE) == []
            assert old.checkpoint.get(uid) is None and new.checkpoint.get(uid) is None
        finally:
            old.stop()
            new.stop()
