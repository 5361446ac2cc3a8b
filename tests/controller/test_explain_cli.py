"""``gpuready plan`` and ``gpuready explain`` against the local API server over real HTTP."""

from __future__ import annotations

import json
import os
import tempfile
import urllib.parse
import urllib.request
from collections.abc import Iterator
from typing import Any

import kubernetes
import pytest
import yaml

from controller import kubectl_plugin
from dra_driver.cli import main
from testbed.apiserver import LocalApiServer
from testbed.controller_harness import running_controller
from testbed.planning_samples import (
    allocated,
    claim,
    device_class,
    dynamic_mig_devices,
    exactly,
    gpu_counter_set,
    gpu_device,
    resource_slice,
)

GROUP, VERSION = "resource.k8s.io", "v1"


@pytest.fixture(scope="module")
def cluster() -> Iterator[tuple[LocalApiServer, str]]:
    with LocalApiServer() as srv:
        client = srv.api_client()
        custom = kubernetes.client.CustomObjectsApi(client)
        core = kubernetes.client.CoreV1Api(client)
        for ns in ("ml",):
            core.create_namespace({"metadata": {"name": ns}})
        custom.create_cluster_custom_object(GROUP, VERSION, "deviceclasses", device_class())
        slices = [
            resource_slice("node-a", [gpu_device(0, node="node-a"), gpu_device(1, node="node-a")]),
            resource_slice("node-b", dynamic_mig_devices(0, "node-b")[:20], slice_count=2, index=1),
            resource_slice("node-b", counter_sets=[gpu_counter_set(0)], slice_count=2, index=2),
        ]
        for s in slices:
            custom.create_cluster_custom_object(GROUP, VERSION, "resourceslices", s)
        for node, cond in (("node-a", {"type": "GPUReady", "status": "False", "reason": "XID79",
                                       "message": "1 of 3 GPU devices not ready: gpu-2: unhealthy: XID 79 (GPU fell off the bus)"}),
                           ("node-b", {"type": "GPUReady", "status": "True", "reason": "AllGPUsReady", "message": "ok"})):
            core.create_node({"metadata": {"name": node}})
            core.patch_node_status(node, {"status": {"conditions": [cond]}})
        held = claim("trainer", [exactly()], namespace="ml")
        custom.create_namespaced_custom_object(GROUP, VERSION, "ml", "resourceclaims", held)
        custom.patch_namespaced_custom_object_status(
            GROUP, VERSION, "ml", "resourceclaims", "trainer",
            {"status": {"allocation": allocated("node-a", "gpu-0"),
                        "reservedFor": [{"resource": "pods", "name": "trainer-0", "uid": "p1"}]}})
        two = claim("two", [exactly(count=2, selectors=('device.attributes["gpu.nvidia.com"].type == "gpu"',))],
                    namespace="ml")
        for c in (two, claim("huge", [exactly(memory="100Gi")], namespace="ml")):
            custom.create_namespaced_custom_object(GROUP, VERSION, "ml", "resourceclaims", c)
        core.create_namespaced_pod("ml", {
            "metadata": {"name": "job-0"},
            "spec": {"containers": [{"name": "c", "image": "busybox"}],
                     "resourceClaims": [{"name": "gpu", "resourceClaimName": "huge"}]},
        })
        path = srv.write_kubeconfig(os.path.join(tempfile.mkdtemp(dir="/tmp"), "kubeconfig"))
        yield srv, path


def _claim_file(obj: dict[str, Any]) -> str:
    path = os.path.join(tempfile.mkdtemp(dir="/tmp"), "claim.yaml")
    with open(path, "w") as f:
        yaml.safe_dump(obj, f)
    return path


def test_plan_prints_the_best_fit_and_the_allocation(cluster: tuple[LocalApiServer, str],
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    _, kubeconfig = cluster
    code = main(["plan", "-f", _claim_file(claim("new", [exactly(memory="15Gi")])), "--kubeconfig", kubeconfig])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "node node-b (binpack)" in out
    assert "gpu: gpu-0-mig-1g20gb-15-0 on node-b (MIG 1g.20gb), 19.5 GiB" in out
    code = main(["plan", "-f", _claim_file(claim("new", [exactly(count=2, selectors=(
        'device.attributes["gpu.nvidia.com"].type == "gpu"',))])), "--kubeconfig", kubeconfig, "-o", "yaml"])
    doc = yaml.safe_load(capsys.readouterr().out)
    # node-a has two GPUs but the trainer holds one: no allocation, exit 1.
    assert code == 1 and doc["allocation"] is None and doc["reasons"]


def test_plan_says_the_scheduler_aborts_on_a_selector_runtime_error(cluster: tuple[LocalApiServer, str],
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    _, kubeconfig = cluster
    # node-a's whole GPUs have no "profile" attribute: an unguarded lookup errors there.
    bad = claim("bad", [exactly(selectors=('device.attributes["gpu.nvidia.com"].profile == "1g.20gb"',))])
    code = main(["plan", "-f", _claim_file(bad), "--kubeconfig", kubeconfig])
    out = capsys.readouterr().out
    assert code == 1
    assert "the kube-scheduler would abort this claim" in out
    assert "has(device.attributes[\"gpu.nvidia.com\"].profile)" in out
    code = main(["plan", "-f", _claim_file(bad), "--kubeconfig", kubeconfig, "-o", "yaml"])
    doc = yaml.safe_load(capsys.readouterr().out)
    assert code == 1 and doc["schedulerAborts"] is True and doc["codes"] == ["cel_error"]


def test_explain_a_claim_names_the_holder_and_the_withdrawn_gpu(cluster: tuple[LocalApiServer, str],
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    _, kubeconfig = cluster
    code = main(["explain", "two", "-n", "ml", "--kubeconfig", kubeconfig])
    out = capsys.readouterr().out
    assert code == 1, out
    assert "excluded, in use: gpu-0 on node-a (NVIDIA H100 80GB HBM3) by claim ml/trainer" in out
    assert "usable now: 1: gpu-1 on node-a" in out
    assert "node-a/gpu-2: unhealthy: XID 79 (GPU fell off the bus)" in out


def test_explain_a_pod_explains_its_claims(cluster: tuple[LocalApiServer, str],
                                           capsys: pytest.CaptureFixture[str]) -> None:
    _, kubeconfig = cluster
    code = main(["explain", "job-0", "-n", "ml", "--kubeconfig", kubeconfig])
    out = capsys.readouterr().out
    assert code == 1 and "Pod ml/job-0: 1 claim" in out and "Claim ml/huge" in out
    assert "has 79.6 GiB of memory, 100 GiB requested" in out
    assert main(["explain", "nothing", "-n", "ml", "--kubeconfig", kubeconfig]) == 2
    assert "no ResourceClaim or Pod named 'nothing'" in capsys.readouterr().err


def test_plan_a_template_with_vram_shaping(cluster: tuple[LocalApiServer, str],
                                           capsys: pytest.CaptureFixture[str]) -> None:
    _, kubeconfig = cluster
    template = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                "metadata": {"name": "vram", "namespace": "ml"},
                "spec": {"spec": {"devices": {"requests": [exactly(memory="30Gi")]}}}}
    code = main(["plan", "-f", _claim_file(template), "--kubeconfig", kubeconfig, "--shape", "gpu.nvidia.com"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert ("request gpu shaped to: up to 39.2 GiB: MIG 3g.40gb (39.2 GiB), MIG 4g.40gb (39.2 GiB); "
            "any size: MIG 7g.80gb (78.9 GiB), NVIDIA H100 80GB HBM3 (79.6 GiB)") in out
    assert "gpu/upto-40gi: gpu-0-mig-3g40gb-9-0 on node-b (MIG 3g.40gb)" in out


def test_allocate_and_reserve_patch_is_accepted_by_the_api_server(cluster: tuple[LocalApiServer, str]) -> None:
    from controller.cluster_snapshot import read_cluster
    from controller.planning import allocate_and_reserve

    srv, _ = cluster
    client = srv.api_client()
    custom = kubernetes.client.CustomObjectsApi(client)
    c = claim("demo-job", [exactly(memory="15Gi")], namespace="ml")
    custom.create_namespaced_custom_object(GROUP, VERSION, "ml", "resourceclaims", c)
    stored = custom.get_namespaced_custom_object(GROUP, VERSION, "ml", "resourceclaims", "demo-job")
    pod = {"metadata": {"name": "demo-0", "uid": "6a0e1c55-1111-4c1e-9a51-000000000001"}}
    out = allocate_and_reserve(stored, read_cluster(client), pod)
    assert out.patch is not None, out.reasons
    custom.patch_namespaced_custom_object_status(GROUP, VERSION, "ml", "resourceclaims", "demo-job", out.patch)
    back = custom.get_namespaced_custom_object(GROUP, VERSION, "ml", "resourceclaims", "demo-job")
    assert back["status"]["allocation"]["devices"]["results"][0]["device"] == "gpu-0-mig-1g20gb-15-0"
    assert back["status"]["reservedFor"] == [{"resource": "pods", "name": "demo-0", "uid": pod["metadata"]["uid"]}]
    # The next claim sees that placement's slices as taken.
    again = allocate_and_reserve(claim("next", [exactly(memory="15Gi")], namespace="ml"), read_cluster(client), pod)
    assert again.patch is not None
    assert again.patch["status"]["allocation"]["devices"]["results"][0]["device"] == "gpu-0-mig-1g20gb-15-2"
    custom.delete_namespaced_custom_object(GROUP, VERSION, "ml", "resourceclaims", "demo-job")


def test_the_running_controller_answers_explain_as_a_list_of_the_fleet_does(
        cluster: tuple[LocalApiServer, str], capsys: pytest.CaptureFixture[str]) -> None:
    # The controller answers from the inventory it keeps anyway (no list of the fleet per question);
    # a person must read the same report, and get the same exit status, either way.
    srv, kubeconfig = cluster
    with running_controller(srv.api_client(), health_port=0, bind_host="127.0.0.1") as ctrl:
        for name, kind in (("two", ""), ("job-0", "pod"), ("huge", "claim"), ("nothing", "")):
            query = urllib.parse.urlencode({"namespace": "ml", "name": name, "kind": kind})
            with urllib.request.urlopen(f"http://127.0.0.1:{ctrl.health_port}/explain?{query}", timeout=10) as resp:
                answer = json.loads(resp.read())
            listed = main(["explain", name, "-n", "ml", "--kubeconfig", kubeconfig, "--controller", ""])
            out = capsys.readouterr()
            assert answer["source"] == "gpuready-controller"
            assert (answer["text"], answer["status"]) == (out.out, listed), name
            if answer["error"]:
                assert f"gpuready explain: {answer['error']}" in out.err, name
        assert answer["error"] == "no ResourceClaim or Pod named 'nothing' in namespace 'ml'"
        assert "Pod ml/job-0: 1 claim" in json.loads(urllib.request.urlopen(
            f"http://127.0.0.1:{ctrl.health_port}/explain?namespace=ml&name=job-0", timeout=10).read())["text"]


def test_without_a_controller_explain_lists_the_fleet_and_says_so(cluster: tuple[LocalApiServer, str],
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    _, kubeconfig = cluster
    assert main(["explain", "two", "-n", "ml", "--kubeconfig", kubeconfig]) == 1
    out = capsys.readouterr()
    assert "usable now: 1: gpu-1 on node-a" in out.out
    assert "the controller did not answer" in out.err and "listing the whole fleet instead" in out.err


def test_kubectl_plugin_reads_the_namespace_of_the_kubeconfig_context(cluster: tuple[LocalApiServer, str],
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    _, kubeconfig = cluster
    with open(kubeconfig) as f:
        config = yaml.safe_load(f)
    config["contexts"].append({"name": "ml-team", "context": {**config["contexts"][0]["context"], "namespace": "ml"}})
    ml = os.path.join(tempfile.mkdtemp(dir="/tmp"), "kubeconfig")
    with open(ml, "w") as f:
        yaml.safe_dump(config, f)
    assert kubectl_plugin.main(["explain", "pod/job-0", "--kubeconfig", ml, "--context", "ml-team",
                                "--controller", ""]) == 1
    assert "Pod ml/job-0: 1 claim" in capsys.readouterr().out
    # The default context sets no namespace: "default", as kubectl, where there is no such pod.
    assert kubectl_plugin.main(["explain", "pod/job-0", "--kubeconfig", ml, "--controller", ""]) == 2
    assert "no Pod named 'job-0' in namespace 'default'" in capsys.readouterr().err
    # A pod is not a claim: resourceclaim/NAME looks for claims only.
    assert kubectl_plugin.main(["explain", "resourceclaim/job-0", "-n", "ml", "--kubeconfig", ml,
                                "--controller", ""]) == 2
    assert "no ResourceClaim named 'job-0'" in capsys.readouterr().err
    assert kubectl_plugin.main(["explain", "deployment/x", "--kubeconfig", ml]) == 2


def test_kubectl_plugin_takes_the_namespace_from_every_file_kubeconfig_names(
        cluster: tuple[LocalApiServer, str], monkeypatch: pytest.MonkeyPatch) -> None:
    # $KUBECONFIG may name several files, as kubectl merges them: the current context can be set in
    # one and defined in another, and the first file to name a context wins.
    _, kubeconfig = cluster
    with open(kubeconfig) as f:
        config = yaml.safe_load(f)
    base = tempfile.mkdtemp(dir="/tmp")
    first, second = os.path.join(base, "first"), os.path.join(base, "second")
    with open(first, "w") as f:
        yaml.safe_dump({"apiVersion": "v1", "kind": "Config", "current-context": "ml-team",
                        "contexts": [{"name": "ml-team", "context": {**config["contexts"][0]["context"],
                                                                     "namespace": "ml"}}]}, f)
    with open(second, "w") as f:
        yaml.safe_dump({**config, "current-context": "other",
                        "contexts": [{"name": "ml-team", "context": {"cluster": "x", "namespace": "elsewhere"}},
                                     {"name": "other", "context": {"cluster": "x", "namespace": "other-ns"}}]}, f)
    monkeypatch.setenv("KUBECONFIG", os.pathsep.join([first, second]))
    assert kubectl_plugin.context_namespace("", "") == "ml"
    assert kubectl_plugin.context_namespace("", "other") == "other-ns"
    assert kubectl_plugin.context_namespace(second, "") == "other-ns"
