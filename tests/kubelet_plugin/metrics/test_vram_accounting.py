"""VRAM accounting: host PIDs -> pods through /proc/<pid>/cgroup, per-claim usage, over-request Events.

The end-to-end tests use the simulated NVML (processes added with ``sim.add_process``), a fake proc
root holding real-looking cgroup files, and the local API server through the real kubernetes client.
"""

from __future__ import annotations

import copy
import tempfile
from pathlib import Path
from typing import Any

import kubernetes
import pytest
from prometheus_client import CollectorRegistry

from dra_driver.devices import GIB
from kubelet_plugin.metrics.cgroup_paths import parse_cgroup_path, parse_proc_cgroup, read_process_identity
from kubelet_plugin.metrics.vram_accounting import (
    EVENT_REASON,
    PodRef,
    PreparedClaim,
    ProcessVram,
    VramAccountant,
    attribute_vram,
    prepared_claim_from_api,
)

POD_UID = "c2845d02-e498-42b3-b7dc-d68d79554c7f"
CID = "4f1c9a7be2d34c5a8b6e0f1a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e"
# A ResourceClaim exactly as a real kube-apiserver 1.36 returned it after the kube-scheduler allocated a
# 20Gi share of a GPU (shared/fixtures/kube-apiserver-1.36/allocated-claim-shared-pod.json).
SHARED_CLAIM: dict[str, Any] = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "ResourceClaim",
    "metadata": {
        "annotations": {
            "resource.kubernetes.io/pod-claim-name": "g"
        },
        "creationTimestamp": "2026-11-29T16:45:51Z",
        "finalizers": [
            "resource.kubernetes.io/delete-protection"
        ],
        "generateName": "shared-pod-g-",
        "name": "shared-pod-g-lgrp2",
        "namespace": "golden",
        "ownerReferences": [
            {
                "apiVersion": "v1",
                "controller": True,
                "kind": "Pod",
                "name": "shared-pod",
                "uid": "c2845d02-e498-42b3-b7dc-d68d79554c7f"
            }
        ],
        "resourceVersion": "1641",
        "uid": "cddb515e-a55f-4a31-a465-797fb183819e"
    },
    "spec": {
        "devices": {
            "requests": [
                {
                    "exactly": {
                        "allocationMode": "ExactCount",
                        "capacity": {
                            "requests": {
                                "memory": "20Gi"
                            }
                        },
                        "count": 1,
                        "deviceClassName": "golden.example.com",
                        "selectors": [
                            {
                                "cel": {
                                    "expression": "device.allowMultipleAllocations"
                                }
                            }
                        ]
                    },
                    "name": "gpu"
                }
            ]
        }
    },
    "status": {
        "allocation": {
            "allocationTimestamp": "2026-11-29T16:45:51Z",
            "devices": {
                "results": [
                    {
                        "consumedCapacity": {
                            "memory": "20Gi"
                        },
                        "device": "gpu-0",
                        "driver": "gpu.example.com",
                        "pool": "node-y",
                        "request": "gpu",
                        "shareID": "5f543f3c-d121-4353-9581-119612a0c5d1"
                    }
                ]
            },
            "nodeSelector": {
                "nodeSelectorTerms": [
                    {
                        "matchFields": [
                            {
                                "key": "metadata.name",
                                "operator": "In",
                                "values": [
                                    "node-y"
                                ]
                            }
                        ]
                    }
                ]
            }
        },
        "reservedFor": [
            {
                "name": "shared-pod",
                "resource": "pods",
                "uid": "c2845d02-e498-42b3-b7dc-d68d79554c7f"
            }
        ]
    }
}

# --- the cgroup parser ------------------------------------------------------------------------------

V1_CGROUPFS = f"""12:pids:/kubepods/burstable/pod{POD_UID}/{CID}
11:memory:/kubepods/burstable/pod{POD_UID}/{CID}
4:devices:/kubepods/burstable/pod{POD_UID}/{CID}
1:name=systemd:/kubepods/burstable/pod{POD_UID}/{CID}
0::/
"""
U = POD_UID.replace("-", "_")
V1_SYSTEMD = f"""13:misc:/
12:cpuset:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{U}.slice/cri-containerd-{CID}.scope
11:memory:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{U}.slice/cri-containerd-{CID}.scope
0::/
"""
V2_SYSTEMD_CONTAINERD = f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{U}.slice/cri-containerd-{CID}.scope\n"
V2_SYSTEMD_CRIO = f"0::/kubepods.slice/kubepods-pod{U}.slice/crio-{CID}.scope\n"
V2_CGROUPFS = f"0::/kubepods/besteffort/pod{POD_UID}/{CID}\n"
V2_DOCKER = f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{U}.slice/docker-{CID}.scope\n"
KIND_NESTED = (f"0::/system.slice/docker-{'9' * 64}.scope/kubelet.slice/kubelet-kubepods.slice/"
               f"kubelet-kubepods-besteffort.slice/kubelet-kubepods-besteffort-pod{U}.slice/cri-containerd-{CID}.scope\n")


@pytest.mark.parametrize("text,runtime", [
    (V1_CGROUPFS, ""), (V1_SYSTEMD, "cri-containerd"), (V2_SYSTEMD_CONTAINERD, "cri-containerd"),
    (V2_SYSTEMD_CRIO, "crio"), (V2_CGROUPFS, ""), (V2_DOCKER, "docker"), (KIND_NESTED, "cri-containerd"),
])
def test_cgroup_files_of_every_driver_and_version_name_the_pod_and_container(text: str, runtime: str) -> None:
    ident = parse_proc_cgroup(text)
    assert ident is not None
    assert ident.pod_uid == POD_UID
    assert ident.container_id == CID
    assert ident.runtime == runtime


def test_non_pod_processes_and_pod_level_paths() -> None:
    assert parse_proc_cgroup("0::/system.slice/containerd.service\n") is None
    assert parse_proc_cgroup("0::/user.slice/user-1000.slice/session-3.scope\n") is None
    assert parse_proc_cgroup("") is None
    # crio's monitor process sits in crio-conmon-<id>.scope: the pod, but no container.
    conmon = parse_cgroup_path(f"/kubepods.slice/kubepods-pod{U}.slice/crio-conmon-{CID}.scope")
    assert conmon is not None and conmon.pod_uid == POD_UID and conmon.container_id == ""
    # Static pods' UIDs are 32 hex digits (a hash of the manifest).
    static = parse_cgroup_path(f"/kubepods/burstable/pod{'ab' * 16}/{CID}")
    assert static is not None and static.pod_uid == "ab" * 16


def test_proc_root_is_injectable_and_exited_processes_are_none(tmp_path: Path) -> None:
    (tmp_path / "4242").mkdir()
    (tmp_path / "4242" / "cgroup").write_text(V2_SYSTEMD_CONTAINERD)
    ident = read_process_identity(4242, tmp_path)
    assert ident is not None and ident.pod_uid == POD_UID
    assert read_process_identity(4243, tmp_path) is None


# --- claims and attribution (pure) ------------------------------------------------------------------

def test_prepared_claim_from_a_claim_the_real_scheduler_allocated() -> None:
    claim = copy.deepcopy(SHARED_CLAIM)
    prepared = prepared_claim_from_api(claim, driver="gpu.example.com", pool="node-y")
    assert prepared.devices == ("gpu-0",)
    assert prepared.requested_for("gpu-0") == 20 * GIB
    assert prepared.pods == (PodRef("shared-pod", "golden", POD_UID),)
    assert prepared_claim_from_api(claim, driver="gpu.example.com", pool="node-z").devices == ()
    whole = copy.deepcopy(SHARED_CLAIM)
    del whole["status"]["allocation"]["devices"]["results"][0]["consumedCapacity"]
    assert prepared_claim_from_api(whole, driver="gpu.example.com", pool="node-y").requested_for("gpu-0") is None
    # A share of a GPU published as N shares (or unlimited) that named no memory consumes 0 of it: no
    # request, so its VRAM use never raises "more than requested".
    share = copy.deepcopy(SHARED_CLAIM)
    share["status"]["allocation"]["devices"]["results"][0]["consumedCapacity"] = {"shares": "1", "memory": "0"}
    prepared = prepared_claim_from_api(share, driver="gpu.example.com", pool="node-y")
    assert prepared.requested_for("gpu-0") is None
    usage = attribute_vram({"gpu-0": [ProcessVram("gpu-0", 1, 3 * GIB, POD_UID)]}, [prepared]).claims[0]
    assert usage.used_bytes == 3 * GIB and not usage.over_request


def test_attribution_splits_a_shared_gpu_between_claims_and_reports_strays() -> None:
    a = PreparedClaim("uid-a", "a", "ns", ("gpu-0",), (PodRef("pa", "ns", "pod-a"),), (("gpu-0", 10 * GIB),))
    b = PreparedClaim("uid-b", "b", "ns", ("gpu-0",), (PodRef("pb", "ns", "pod-b"),), (("gpu-0", 20 * GIB),))
    procs = {"gpu-0": [ProcessVram("gpu-0", 1, 12 * GIB, "pod-a"), ProcessVram("gpu-0", 2, 3 * GIB, "pod-a"),
                       ProcessVram("gpu-0", 3, 5 * GIB, "pod-b"), ProcessVram("gpu-0", 4, 1 * GIB, ""),
                       ProcessVram("gpu-0", 5, 2 * GIB, "pod-x")]}
    report = attribute_vram(procs, [b, a])
    by_claim = {c.claim.claim_name: c for c in report.claims}
    assert by_claim["a"].used_bytes == 15 * GIB and by_claim["a"].over_request
    assert by_claim["b"].used_bytes == 5 * GIB and not by_claim["b"].over_request
    assert sorted(p.pid for p in report.unattributed) == [4, 5]


# --- end to end: simulated GPU, fake /proc, local API server ----------------------------------------

@pytest.fixture()
def cluster() -> Any:
    from testbed.apiserver import LocalApiServer

    with LocalApiServer() as srv:
        yield srv


@pytest.fixture()
def core(cluster: Any) -> Any:
    """The core/v1 API of ``cluster`` through the real kubernetes client."""
    return kubernetes.client.CoreV1Api(cluster.api_client())


@pytest.fixture()
def sim_node() -> tuple[Any, Any]:
    """A simulated 8x H100 node: (its simulated NVML, the devices discovered on it)."""
    from kubelet_plugin.nvml import discover, open_nvml

    sim = open_nvml("sim:8xh100")
    return sim, discover(sim)


def _make_pod(core: Any, name: str, namespace: str, container_id: str) -> str:
    try:
        core.create_namespace({"metadata": {"name": namespace}})
    except kubernetes.client.ApiException as exc:
        if exc.status != 409:
            raise
    pod = core.create_namespaced_pod(namespace, {
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "notebook", "image": "cuda"}]}})
    pod_uid: str = pod.metadata.uid
    core.patch_namespaced_pod_status(name, namespace, {"status": {"phase": "Running", "containerStatuses": [
        {"name": "notebook", "containerID": f"containerd://{container_id}", "image": "cuda", "imageID": "",
         "ready": True, "restartCount": 0, "state": {"running": {}}}]}})
    return pod_uid


def _write_cgroup(root: Path, pid: int, pod_uid: str, container_id: str) -> None:
    (root / str(pid)).mkdir(parents=True, exist_ok=True)
    u = pod_uid.replace("-", "_")
    (root / str(pid) / "cgroup").write_text(
        f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{u}.slice/cri-containerd-{container_id}.scope\n")


def _vram_events(core: Any, namespace: str) -> list[Any]:
    return [e for e in core.list_namespaced_event(namespace).items if e.reason == EVENT_REASON]


def test_claim_over_its_vram_request_gets_one_event_naming_process_vram_and_request(
        core: Any, sim_node: tuple[Any, Any]) -> None:
    sim, node = sim_node
    gpu = node.gpus[0]
    pod_uid = _make_pod(core, "shared-pod", "golden", CID)

    claim_obj = copy.deepcopy(SHARED_CLAIM)
    result = claim_obj["status"]["allocation"]["devices"]["results"][0]
    result.update(driver="gpu.nvidia.com", pool="node-y", device=gpu.name)
    claim_obj["status"]["reservedFor"][0]["uid"] = pod_uid
    claim = prepared_claim_from_api(claim_obj, driver="gpu.nvidia.com", pool="node-y")
    whole_gpu = PreparedClaim("uid-whole", "whole", "golden", (node.gpus[1].name,),
                              (PodRef("shared-pod", "golden", pod_uid),))

    proc_root = Path(tempfile.mkdtemp(prefix="proc-", dir="/tmp"))
    _write_cgroup(proc_root, 4242, pod_uid, CID)
    _write_cgroup(proc_root, 4343, pod_uid, CID)
    sim.add_process(gpu.index, 4242, 25 * GIB)   # over the 20 GiB request
    sim.add_process(node.gpus[1].index, 4343, 70 * GIB)  # a whole GPU: no request, never "over"
    sim.add_process(gpu.index, 999, 1 * GIB)     # not in any pod (no cgroup file)

    accountant = VramAccountant(sim, lambda: node, lambda: [claim, whole_gpu], core_api=core,
                                proc_root=proc_root, node="node-y")
    over = accountant.check()
    assert [(c.claim.claim_name, c.device) for c in over] == [("shared-pod-g-lgrp2", gpu.name)]
    events = _vram_events(core, "golden")
    assert len(events) == 1
    event = events[0]
    assert event.type == "Warning"
    assert event.involved_object.kind == "Pod" and event.involved_object.uid == pod_uid
    for text in ("process 4242", "container notebook", "25.0 GiB", "20.0 GiB", gpu.name, "shared-pod-g-lgrp2"):
        assert text in event.message, f"{text!r} not in {event.message!r}"

    # Still over: no second Event.
    accountant.check()
    assert len(_vram_events(core, "golden")) == 1
    # Back under the request, then over again: a new crossing, a new Event.
    sim.remove_process(gpu.index, 4242)
    sim.add_process(gpu.index, 4242, 15 * GIB)
    assert accountant.check() == []
    sim.remove_process(gpu.index, 4242)
    sim.add_process(gpu.index, 4242, 30 * GIB)
    accountant.check()
    events = _vram_events(core, "golden")
    assert len(events) == 2 and any("30.0 GiB" in e.message for e in events)

    # The same numbers on /metrics.
    registry = CollectorRegistry()
    registry.register(accountant.collector())
    labels = {"node": "node-y", "namespace": "golden", "claim": "shared-pod-g-lgrp2", "pod": "shared-pod",
              "device": gpu.name}
    assert registry.get_sample_value("gpuready_claim_vram_used_bytes", labels) == 30 * GIB
    assert registry.get_sample_value("gpuready_claim_vram_requested_bytes", labels) == 20 * GIB
    whole_labels = dict(labels, claim="whole", device=node.gpus[1].name)
    assert registry.get_sample_value("gpuready_claim_vram_used_bytes", whole_labels) == 70 * GIB
    assert registry.get_sample_value("gpuready_claim_vram_requested_bytes", whole_labels) is None
    assert registry.get_sample_value("gpuready_unattributed_vram_used_bytes",
                                     {"node": "node-y", "device": gpu.name}) == 1 * GIB


def test_event_failure_is_retried_and_never_breaks_accounting(
        cluster: Any, core: Any, sim_node: tuple[Any, Any]) -> None:
    sim, node = sim_node
    gpu = node.gpus[2]
    pod_uid = _make_pod(core, "p", "team", CID)
    claim = PreparedClaim("uid-1", "c", "team", (gpu.name,), (PodRef("p", "team", pod_uid),), ((gpu.name, GIB),))
    proc_root = Path(tempfile.mkdtemp(prefix="proc-", dir="/tmp"))
    _write_cgroup(proc_root, 77, pod_uid, CID)
    sim.add_process(gpu.index, 77, 2 * GIB)
    accountant = VramAccountant(sim, lambda: node, lambda: [claim], core_api=core, proc_root=proc_root)
    cluster.faults.fail_next(1, code=503, verb="create", resource="events")
    assert len(accountant.check()) == 1  # reported as over even though the Event failed
    assert _vram_events(core, "team") == []
    accountant.check()  # retried
    assert len(_vram_events(core, "team")) == 1


def test_claims_provider_reads_pods_and_requests_from_the_api_and_follows_deletion(cluster: Any, core: Any) -> None:
    from kubelet_plugin.metrics.prepared_claims import PreparedClaims
    from kubelet_plugin.metrics.vram_accounting import allocations_from_claims

    resource = kubernetes.client.ResourceV1Api(cluster.api_client())
    pod_uid = _make_pod(core, "shared-pod", "golden", CID)
    body = copy.deepcopy(SHARED_CLAIM)
    status = body.pop("status")
    for key in ("uid", "resourceVersion", "creationTimestamp", "ownerReferences", "generateName", "finalizers"):
        body["metadata"].pop(key, None)
    created = resource.create_namespaced_resource_claim("golden", body)
    status["allocation"]["devices"]["results"][0].update(driver="gpu.nvidia.com", pool="node-y")
    status["reservedFor"][0]["uid"] = pod_uid
    resource.replace_namespaced_resource_claim_status(
        created.metadata.name, "golden",
        {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
         "metadata": {"name": created.metadata.name, "namespace": "golden",
                      "resourceVersion": created.metadata.resource_version},
         "spec": body["spec"], "status": status})
    refs = [("golden", created.metadata.name, created.metadata.uid), ("golden", "gone", "uid-gone")]
    provider = PreparedClaims(cluster.api_client(), "gpu.nvidia.com", "node-y", lambda: refs, ttl_s=0)
    claims = provider()
    assert len(claims) == 1
    claim = claims[0]
    assert claim.devices == ("gpu-0",) and claim.requested_for("gpu-0") == 20 * GIB
    assert claim.pods == (PodRef("shared-pod", "golden", pod_uid),)
    allocations = allocations_from_claims(claims)
    assert allocations["gpu-0"][0].pod == "shared-pod"
    # Deleted and re-created under the same name: the new UID is not the prepared claim.
    resource.delete_namespaced_resource_claim(created.metadata.name, "golden")
    assert provider() == []
    resource.create_namespaced_resource_claim("golden", body)
    assert provider() == []


def test_an_idle_node_checks_nothing(sim_node: tuple[Any, Any]) -> None:
    # No prepared claim: the periodic check neither lists GPU processes nor asks the kubelet.
    sim, node = sim_node
    asked: list[int] = []

    def pod_resources() -> None:
        asked.append(1)

    def no_process_reads(*args: Any) -> Any:
        raise AssertionError("an idle check read the GPUs' processes")

    accountant = VramAccountant(sim, lambda: node, lambda: [], pod_resources=pod_resources)
    accountant.device_processes = no_process_reads  # type: ignore[method-assign]
    assert accountant.check() == [] and asked == []
