"""/metrics over HTTP: gpuready's own families plus dcgm-named GPU readings on a simulated 8-GPU node."""

from __future__ import annotations

import socket
import urllib.request
from collections import defaultdict
from typing import Any

import pytest
from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from controller.controller_metrics import ControllerMetrics
from dra_driver.devices import GIB, MIB
from dra_driver.metrics_server import metrics_url, serve_metrics
from kubelet_plugin.metrics import DeviceAllocation, GpuCollector, PluginMetrics
from kubelet_plugin.nvml import discover, open_nvml

NODE = "gpu-node-a"
PER_GPU = ("DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
           "DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL")
WHOLE_GPU_ONLY = ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_MEM_COPY_UTIL")  # NVML refuses them with MIG on
PER_INSTANCE = ("DCGM_FI_DEV_FB_TOTAL", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_USED")


class Scraper:
    """A plugin's metrics served on a real port and read the way Prometheus would."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.server, self.thread = serve_metrics(registry, "127.0.0.1", 0)
        self.url = metrics_url(self.server)

    def scrape(self) -> dict[str, list[tuple[dict[str, str], float]]]:
        with urllib.request.urlopen(self.url, timeout=10) as resp:
            assert resp.status == 200
            assert resp.headers["Content-Type"].startswith("text/plain")
            text = resp.read().decode()
        self.types: dict[str, str] = {}
        out: dict[str, list[tuple[dict[str, str], float]]] = defaultdict(list)
        for family in text_string_to_metric_families(text):
            self.types[family.name] = family.type
            for sample in family.samples:
                out[sample.name].append((sample.labels, sample.value))
        return out

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture()
def node_a() -> Any:
    sim = open_nvml("sim:8xh100@gpu-node-a")
    node = discover(sim)
    registry = CollectorRegistry()
    metrics = PluginMetrics(registry, node=NODE)
    allocations: dict[str, list[DeviceAllocation]] = {
        "gpu-3": [DeviceAllocation("gpu-3", "uid-1", "train-gpu", "ml", pod="trainer-0", pod_namespace="ml",
                                   pod_uid="p1", containers=("main",))],
        "gpu-4": [DeviceAllocation("gpu-4", "uid-2", "a", "ml", pod="nb-a", pod_namespace="ml"),
                  DeviceAllocation("gpu-4", "uid-3", "b", "ml", pod="nb-b", pod_namespace="ml")],
    }
    registry.register(GpuCollector(sim, lambda: node, lambda: allocations, metrics.last_xids, node=NODE))
    scraper = Scraper(registry)
    yield sim, node, metrics, scraper
    scraper.close()


def _by_gpu(samples: list[tuple[dict[str, str], float]]) -> dict[str, tuple[dict[str, str], float]]:
    return {labels["gpu"]: (labels, value) for labels, value in samples}


def _check_gpu_labels(labels: dict[str, str], gpu: Any, node: Any) -> None:
    assert labels["UUID"] == gpu.uuid
    assert labels["modelName"] == "NVIDIA H100 80GB HBM3"
    assert labels["pci_bus_id"] == gpu.pci_bus_id
    assert labels["device"] == f"nvidia{gpu.index}"
    assert labels["Hostname"] == NODE
    assert labels["DCGM_FI_DRIVER_VERSION"] == node.driver_version
    assert labels["dra_driver_name"] == "gpu.nvidia.com" and labels["dra_pool_name"] == NODE


def test_every_dcgm_family_has_every_gpu_with_dcgm_labels(node_a: Any) -> None:
    # The 8xh100 profile is a mixed node: six whole GPUs, gpu-6 and gpu-7 in MIG mode (4 and 7 instances).
    _, node, _, scraper = node_a
    got = scraper.scrape()
    gpus = {str(g.index): g for g in node.gpus}
    whole = {i for i, g in gpus.items() if not g.mig_devices}
    assert len(whole) == 6
    for name in PER_GPU:
        per_gpu = _by_gpu(got[name])
        assert set(per_gpu) == set(gpus), name
        for index, (labels, _) in per_gpu.items():
            _check_gpu_labels(labels, gpus[index], node)
            assert labels["dra_device_name"] == gpus[index].name and "GPU_I_ID" not in labels
    for name in WHOLE_GPU_ONLY:
        assert set(_by_gpu(got[name])) == whole, name
    for name in PER_INSTANCE:
        seen = set()
        for labels, _ in got[name]:
            gpu = gpus[labels["gpu"]]
            _check_gpu_labels(labels, gpu, node)
            if gpu.mig_devices:
                mig = next(m for m in gpu.mig_devices if str(m.gpu_instance_id) == labels["GPU_I_ID"])
                assert labels["GPU_I_PROFILE"] == mig.profile.name and labels["dra_device_name"] == mig.name
            else:
                assert "GPU_I_ID" not in labels and labels["dra_device_name"] == gpu.name
            seen.add(labels["dra_device_name"])
        assert len(seen) == 6 + 4 + 7, name
    # dcgm-exporter's counters keep their exact names (no _total); gauges stay gauges.
    assert scraper.types["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"] in ("unknown", "untyped")
    assert scraper.types["DCGM_FI_DEV_FB_USED"] == "gauge"


def test_readings_match_nvml_and_follow_processes(node_a: Any) -> None:
    sim, node, _, scraper = node_a
    gpu = node.gpus[1]
    before = _by_gpu(scraper.scrape()["DCGM_FI_DEV_FB_USED"])[str(gpu.index)][1]
    sim.add_process(gpu.index, 31337, 10 * GIB)
    got = scraper.scrape()
    after = _by_gpu(got["DCGM_FI_DEV_FB_USED"])[str(gpu.index)][1]
    assert after - before == pytest.approx(10 * 1024, abs=1)  # MiB
    total = _by_gpu(got["DCGM_FI_DEV_FB_TOTAL"])[str(gpu.index)][1]
    assert total == gpu.memory_bytes // MIB  # whole MiB, as DCGM reports them
    assert all(v == int(v) for name in PER_INSTANCE for _, v in got[name]), "fractional MiB"
    handle = sim.nvmlDeviceGetHandleByUUID(gpu.uuid)
    watts = _by_gpu(got["DCGM_FI_DEV_POWER_USAGE"])[str(gpu.index)][1]
    assert watts == pytest.approx(sim.nvmlDeviceGetPowerUsage(handle) / 1000, rel=0.05)
    assert _by_gpu(got["DCGM_FI_DEV_GPU_TEMP"])[str(gpu.index)][1] == sim.nvmlDeviceGetTemperature(handle, 0)


def test_allocated_devices_carry_pod_and_claim_labels(node_a: Any) -> None:
    _, _, _, scraper = node_a
    fb = _by_gpu(scraper.scrape()["DCGM_FI_DEV_FB_USED"])
    labels = fb["3"][0]
    assert (labels["namespace"], labels["pod"], labels["container"]) == ("ml", "trainer-0", "main")
    assert (labels["dra_claim_name"], labels["dra_claim_namespace"]) == ("train-gpu", "ml")
    # Unallocated, and shared by two claims (would be counted twice): no pod labels.
    assert "pod" not in fb["0"][0] and "pod" not in fb["4"][0]


def test_xid_and_health_and_plugin_families(node_a: Any) -> None:
    _, node, metrics, scraper = node_a
    bad = node.gpus[5]
    metrics.record_xid(bad.name, bad.uuid, 79, withdrew=True)
    metrics.record_xid(bad.name, bad.uuid, 13, withdrew=False)
    metrics.set_device_health(bad.name, "Unhealthy", "XID 79 (GPU has fallen off the bus)")
    for g in node.gpus:
        if g is not bad:
            metrics.set_device_health(g.name, "Healthy")
    metrics.observe_validation("gpu-0", 0.42, ok=True)
    metrics.observe_validation(bad.name, 3.1, ok=False, failed_step="cuda")
    metrics.set_published(7, 1)
    metrics.observe_prepare(0.004, ok=True)
    metrics.observe_prepare(0.030, ok=False, reason="claim_not_found")
    metrics.observe_unprepare(0.002, ok=True)
    metrics.count_checkpoint_writes({"success": 2, "error": 0})  # what the checkpoint store counted
    metrics.health_stream_clients(+1)
    metrics.health_stream_clients(+1)
    metrics.health_stream_clients(-1)
    got = scraper.scrape()

    xid = _by_gpu(got["DCGM_FI_DEV_XID_ERRORS"])
    assert xid[str(bad.index)][1] == 13 and xid[str(bad.index)][0]["err_code"] == "13"  # the last XID
    assert "graphics engine exception" in xid[str(bad.index)][0]["err_msg"]  # dcgm-exporter's err_msg
    assert xid["0"][1] == 0
    xid_total = {(s["xid"], s["action"]): v for s, v in got["gpuready_xid_errors_total"] if s["device"] == bad.name}
    assert xid_total == {("79", "withdraw"): 1, ("13", "ignore"): 1}

    states = {(s["device"], s["state"]): v for s, v in got["gpuready_device_health_state"]}
    assert states[(bad.name, "Unhealthy")] == 1 and states[(bad.name, "Healthy")] == 0
    assert states[("gpu-0", "Healthy")] == 1
    reasons = [(s["device"], s["reason"]) for s, v in got["gpuready_device_unhealthy_reason"] if v == 1]
    assert reasons == [(bad.name, "XID 79 (GPU has fallen off the bus)")]

    val = {s["device"]: v for s, v in got["gpuready_validation_result"]}
    assert val == {"gpu-0": 1, bad.name: 0}
    assert [(s["step"], v) for s, v in got["gpuready_validation_failures_total"]] == [("cuda", 1)]
    assert got["gpuready_published_devices"] == [({"node": NODE}, 7)]
    assert got["gpuready_withdrawn_devices"] == [({"node": NODE}, 1)]
    buckets = {(s["result"], s["le"]): v for s, v in got["gpuready_prepare_duration_seconds_bucket"]}
    assert buckets[("success", "0.002")] == 0 and buckets[("success", "0.005")] == 1
    assert buckets[("error", "0.02")] == 0 and buckets[("error", "0.05")] == 1
    assert [(s["reason"], v) for s, v in got["gpuready_prepare_errors_total"]] == [("claim_not_found", 1)]
    assert ({"node": NODE, "result": "success"}, 2) in got["gpuready_checkpoint_writes_total"]
    assert got["gpuready_health_stream_clients"] == [({"node": NODE}, 1)]

    # Recovery: the reason series disappears, the state flips, the transition is counted.
    metrics.set_device_health(bad.name, "Recovering", "XID 79 cleared; validating")
    metrics.set_device_health(bad.name, "Healthy")
    got = scraper.scrape()
    assert [s for s, v in got["gpuready_device_unhealthy_reason"] if s["device"] == bad.name] == []
    trans = {s["state"]: v for s, v in got["gpuready_device_health_transitions_total"] if s["device"] == bad.name}
    assert trans == {"Unhealthy": 1, "Recovering": 1, "Healthy": 1}


def test_lost_gpu_leaves_the_scrape_working(node_a: Any) -> None:
    sim, node, _, scraper = node_a
    sim.faults.gpu_lost(2)
    got = scraper.scrape()
    reach = {s["gpu"]: v for s, v in got["gpuready_gpu_nvml_reachable"]}
    lost = str(node.gpus[2].index)
    assert reach[lost] == 0 and all(v == 1 for g, v in reach.items() if g != lost)
    assert lost not in _by_gpu(got["DCGM_FI_DEV_GPU_TEMP"])
    assert len(got["DCGM_FI_DEV_GPU_TEMP"]) == 7


def test_mig_devices_are_reported_per_gpu_instance() -> None:
    sim = open_nvml("sim:h100-mixed-mig")
    node = discover(sim)
    registry = CollectorRegistry()
    registry.register(GpuCollector(sim, lambda: node, node=NODE))
    scraper = Scraper(registry)
    try:
        got = scraper.scrape()
    finally:
        scraper.close()
    gpu = node.gpus[0]
    fb = {s["GPU_I_ID"]: (s, v) for s, v in got["DCGM_FI_DEV_FB_TOTAL"]}
    assert set(fb) == {str(m.gpu_instance_id) for m in gpu.mig_devices}
    for mig in gpu.mig_devices:
        labels, value = fb[str(mig.gpu_instance_id)]
        assert labels["GPU_I_PROFILE"] == mig.profile.name and labels["UUID"] == gpu.uuid
        assert labels["dra_device_name"] == mig.name and labels["dra_mig_device_uuid"] == mig.uuid
        assert value == pytest.approx(mig.memory_bytes / MIB, abs=1)
    assert "DCGM_FI_DEV_GPU_UTIL" not in got  # NVML does not support it with MIG on
    assert len(got["DCGM_FI_DEV_GPU_TEMP"]) == 1  # the physical GPU's readings stay


def test_plugins_in_one_process_do_not_collide_or_touch_the_global_registry() -> None:
    before = {m.name for m in REGISTRY.collect()}
    a, b = PluginMetrics(node="node-a"), PluginMetrics(node="node-b")
    a.set_published(8, 0)
    b.set_published(6, 2)
    assert a.registry is not b.registry
    assert a.registry.get_sample_value("gpuready_published_devices", {"node": "node-a"}) == 8
    assert b.registry.get_sample_value("gpuready_published_devices", {"node": "node-b"}) == 6
    assert {m.name for m in REGISTRY.collect()} == before


def test_bad_calls_fail_with_the_allowed_values() -> None:
    metrics = PluginMetrics(node="n")
    with pytest.raises(ValueError, match="Healthy, Unhealthy, Recovering"):
        metrics.set_device_health("gpu-0", "Broken")
    with pytest.raises(ValueError, match="mutated, unchanged"):
        ControllerMetrics().observe_webhook("mutate", "ResourceClaim", 0.001, "ok")


def test_port_in_use_names_the_flag_to_change() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(OSError, match="--metrics-port"):
            serve_metrics(CollectorRegistry(), "127.0.0.1", port)


def test_controller_families_over_http() -> None:
    metrics = ControllerMetrics(driver_name="gpu.nvidia.com")
    metrics.set_leader(True)
    metrics.observe_planning(0.0004, "binpack", ok=True)
    metrics.observe_planning(0.002, "binpack", ok=False)
    metrics.observe_webhook("mutate", "ResourceClaim", 0.003, "mutated")
    metrics.observe_webhook("validate", "ResourceClaimTemplate", 0.001, "denied")
    metrics.observe_placement("binpack", ok=True)
    metrics.observe_unfit("memory")
    metrics.set_unfit_claims({"memory": 2, "selector": 1})
    metrics.set_unfit_claims({"memory": 1})
    metrics.reconciler_action("evict")
    scraper = Scraper(metrics.registry)
    try:
        got = scraper.scrape()
    finally:
        scraper.close()
    assert got["gpuready_controller_is_leader"] == [({}, 1)]
    plan = {(s["result"]): v for s, v in got["gpuready_controller_planning_duration_seconds_count"]}
    assert plan == {"fit": 1, "unfit": 1}
    hooks = {(s["webhook"], s["kind"], s["outcome"]): v for s, v in got["gpuready_controller_webhook_requests_total"]}
    assert hooks == {("mutate", "ResourceClaim", "mutated"): 1, ("validate", "ResourceClaimTemplate", "denied"): 1}
    assert got["gpuready_controller_unfit_claims"] == [({"reason": "memory"}, 1)]
    assert ({"policy": "binpack", "result": "placed"}, 1) in got["gpuready_controller_placements_total"]
    assert ({"action": "evict", "result": "success"}, 1) in got["gpuready_controller_reconciler_actions_total"]


def test_framebuffer_readings_survive_a_driver_without_v2_memory_info() -> None:
    import pynvml

    sim = open_nvml("sim:h100-80gb")
    node = discover(sim)

    class OldDriver:
        """The simulator, but GetMemoryInfo(version=v2) fails as on drivers before R510."""

        def __getattr__(self, name: str) -> Any:
            return getattr(sim, name)

        def nvmlDeviceGetMemoryInfo(self, handle: Any, version: Any = None) -> Any:
            if version is not None:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
            return sim.nvmlDeviceGetMemoryInfo(handle)

    registry = CollectorRegistry()
    registry.register(GpuCollector(OldDriver(), lambda: node, node=NODE))
    total = registry.get_sample_value("DCGM_FI_DEV_FB_TOTAL", {
        "gpu": "0", "UUID": node.gpus[0].uuid, "pci_bus_id": node.gpus[0].pci_bus_id, "device": "nvidia0",
        "modelName": node.gpus[0].product_name, "Hostname": NODE, "DCGM_FI_DRIVER_VERSION": node.driver_version,
        "dra_driver_name": "gpu.nvidia.com", "dra_pool_name": NODE, "dra_device_name": node.gpus[0].name})
    assert total == pytest.approx(node.gpus[0].memory_bytes / MIB, abs=1)
