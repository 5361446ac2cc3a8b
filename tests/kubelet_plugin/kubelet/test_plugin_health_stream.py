"""The kubelet health stream: full list on connect, on every change, and periodically (v1 and v1alpha1)."""

from __future__ import annotations

import time
from typing import Any

import grpc
import kubernetes

from proto import health_v1alpha1_pb2, health_v1alpha1_pb2_grpc
from testbed.plugin_harness import PluginHarness
from testbed.waiting import wait_for

NODE = "hn"


def test_stream_sends_full_list_on_connect_on_change_and_periodically() -> None:
    with PluginHarness() as h:
        plugin = h.start_plugin(NODE, "sim:8xh100", health_interval=0.5)
        kubelet = h.kubelet(NODE)
        stream = kubelet.watch_health(timeout=30)
        first = next(stream)
        assert kubelet.health_service == "v1"
        assert sorted(r.device for r in first) == sorted(plugin.inventory.current().index)
        assert {r.health for r in first} == {"HEALTHY"} and {r.pool for r in first} == {NODE}
        assert all(r.health_check_timeout >= 30 for r in first)

        plugin.fixed_health.set_unhealthy({"gpu-3": "XID 79: GPU has fallen off the bus"})
        changed = next(stream)
        by_name = {r.device: r for r in changed}
        assert by_name["gpu-3"].health == "UNHEALTHY" and "XID 79" in by_name["gpu-3"].message
        assert len(changed) == len(first)  # still the full list, not a delta

        # No change: the snapshot is still re-sent every interval (0.5 s here, 20 s by default).
        start = time.monotonic()
        resent = [next(stream) for _ in range(3)]
        assert time.monotonic() - start < 10
        assert all(len(m) == len(first) for m in resent)
        stream.close()


def test_v1alpha1_health_service_answers_too() -> None:
    with PluginHarness() as h:
        plugin = h.start_plugin(NODE, "sim:h100-80gb")
        with grpc.insecure_channel(f"unix://{plugin.paths.dra}") as channel:
            call = health_v1alpha1_pb2_grpc.DRAResourceHealthStub(channel).NodeWatchResources(
                health_v1alpha1_pb2.NodeWatchResourcesRequest(), timeout=10)
            message = next(iter(call))
            call.cancel()
        assert [(d.device.pool_name, d.device.device_name, d.health) for d in message.devices] == [
            (NODE, "gpu-0", health_v1alpha1_pb2.HEALTHY)]


def test_health_monitor_withdraws_device_and_stream_reports_it() -> None:
    with PluginHarness() as h:
        plugin = h.start_plugin(NODE, "sim:h100-80gb", health_mode="withdraw", health_interval=0.5)
        assert plugin.health_monitor.wait_validated(60)
        kubelet = h.kubelet(NODE)
        stream = kubelet.watch_health(timeout=60)
        deadline = time.monotonic() + 30
        while [r.health for r in next(stream)] != ["HEALTHY"]:
            assert time.monotonic() < deadline, "gpu-0 never reported healthy"
        uid = h.create_claim("c1", [("gpu", NODE, "gpu-0")])
        plugin.nvml.faults.inject_xid(0, 79)
        deadline = time.monotonic() + 30
        while True:
            report = next(stream)[0]
            if report.health == "UNHEALTHY":
                break
            assert time.monotonic() < deadline, "XID 79 never reached the health stream"
        assert "79" in report.message
        err = kubelet.prepare([("default", "c1", uid)])[uid].error
        assert "gpu-0 is unhealthy" in err
        stream.close()
        # People see it on the Node too (its writer hears of the XID after the health stream does).
        def gpu_ready_false() -> Any:
            node = kubernetes.client.CoreV1Api(h.api_client).read_node(NODE)
            ready = next(c for c in node.status.conditions or [] if c.type == "GPUReady")
            return ready if ready.status == "False" else None

        assert "79" in wait_for("GPUReady False on the Node", gpu_ready_false, timeout=10).message


def test_a_stream_the_kubelet_closes_ends_at_once_though_it_sleeps_until_the_next_resend() -> None:
    # Idle streams sleep until their next resend (20 s here) instead of waking every second; the
    # gRPC termination callback must still end a closed stream's server side at once.
    with PluginHarness() as h:
        plugin = h.start_plugin(NODE, "sim:8xh100", health_interval=20.0)
        gauge = plugin.metrics.health_stream_clients_gauge.labels(NODE)
        stream = h.kubelet(NODE).watch_health(timeout=30)
        next(stream)
        assert gauge._value.get() == 1
        stream.close()
        deadline = time.monotonic() + 3
        while gauge._value.get() != 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert gauge._value.get() == 0, "the closed stream still holds a server thread"
