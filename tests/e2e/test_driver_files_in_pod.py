"""A pod's program loads the node's libcuda through gpuready's CDI spec, in both image layouts.

The node's driver root is a fake driver install (testbed/realcluster/fake_driver.py: the fake
``libcuda.so.580.159.04`` with its ``libcuda.so.1`` link and a loader cache, and an ELF
``nvidia-smi``), given to the plugin as a real host's would be (chart value ``driverRoot``,
``--driver-root``). The images (testbed/realcluster/cuda_images.py) hold no NVIDIA file: the
``cuda-check`` program ``dlopen``\\ s ``libcuda.so.1`` by name, so it finds it only if the CDI spec
mounted it (``/usr/local/nvidia/lib64/libcuda.so.1``) and its ``createContainer`` hook put that
directory into the image's loader cache. ``debian`` is a multiarch image with its own ldconfig;
``lib64`` a RHEL-like one whose libraries are found only through its ``ld.so.cache``, with no
ldconfig and no ``ld.so.conf`` (the hook uses the host's ``ldconfig -r``).

A user sees: the program found libcuda where gpuready put it, and the fake driver's ``cuInit`` said
``CUDA_ERROR_NO_DEVICE`` (100), so the pod ends Failed with cuda-check's exit code 3 (a real GPU
passes there); the GPU's device node is in the container; ``nvidia-smi`` from the driver runs;
the same as a non-root user; and a pod without a claim sees no driver and no device node.
"""

from __future__ import annotations

import glob
import json
import os
from typing import Any

import pytest
import yaml
from e2e_support import E2E, wait_for

from testbed.realcluster.cuda_images import CUDA_CHECK_IMAGES, FAKE_DRIVER_VERSION
from testbed.realcluster.fake_driver import LIB_DIR, NVIDIA_SMI_OUTPUT

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("realcluster")]  # one real cluster per run

CONTAINER_LIBCUDA = "/usr/local/nvidia/lib64/libcuda.so.1"
CUDA_ERROR_NO_DEVICE = 100
EXIT_CUDA_FAILED = 3  # cuda-check: libcuda loaded, cuInit (or a later CUDA step) failed
# The claim pods stay up this long after their report, so their claims' CDI specs can be read
# (the kubelet unprepares a claim once its pod has ended, and the claim from the template goes).
HOLD_SECONDS = 3
CLAIM_TEMPLATE = """
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata:
  name: one-gpu
spec:
  spec:
    devices:
      requests:
      - name: gpu
        exactly:
          deviceClassName: gpu.nvidia.com
"""


def _pod(name: str, layout: str, args: list[str], *, claim: bool, run_as: int | None = None,
         nvidia_smi: bool = False) -> dict[str, Any]:
    """A one-shot pod running cuda-check from the ``layout`` image (with the one-GPU claim, as ``run_as``),
    plus a container running the driver's ``nvidia-smi`` when asked."""
    image = CUDA_CHECK_IMAGES[layout]
    claims = {"resources": {"claims": [{"name": "gpu"}]}} if claim else {}
    containers: list[dict[str, Any]] = [
        {"name": "cuda-check", "image": image, "imagePullPolicy": "Never", "args": args, **claims}]
    if nvidia_smi:
        containers.append({"name": "nvidia-smi", "image": image, "imagePullPolicy": "Never",
                           "command": ["/usr/bin/nvidia-smi"], **claims})
    spec: dict[str, Any] = {"restartPolicy": "Never", "terminationGracePeriodSeconds": 2, "containers": containers}
    if claim:
        spec["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}]
    if run_as is not None:
        spec["securityContext"] = {"runAsUser": run_as, "runAsGroup": run_as, "runAsNonRoot": True}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


HOLD = ["--hold-seconds", str(HOLD_SECONDS)]
# Each with a one-GPU claim: both layouts as root, lib64 as a user; nvidia-smi beside cuda-check as root.
GPU_PODS = {
    "cuda-debian": _pod("cuda-debian", "debian", HOLD, claim=True, nvidia_smi=True),
    "cuda-lib64": _pod("cuda-lib64", "lib64", HOLD, claim=True, nvidia_smi=True),
    "cuda-lib64-nonroot": _pod("cuda-lib64-nonroot", "lib64", HOLD, claim=True, run_as=1000),
}
NO_GPU_POD = _pod("cuda-no-claim", "lib64", ["--expect-no-gpu"], claim=False)


def _report(e2e: E2E, namespace: str, pod: str) -> str:
    """What a user would look at: ``kubectl describe pod`` and every container's log."""
    parts = [e2e.describe_pod(namespace, pod)]
    try:
        for c in e2e.pod(namespace, pod).spec.containers:
            try:
                parts.append(f"--- log of {pod}/{c.name} ---\n{e2e.pod_logs(namespace, pod, c.name)}")
            except Exception as e:  # a container that never started has no log
                parts.append(f"--- no log of {pod}/{c.name}: {e}")
    except Exception as e:
        parts.append(f"(pod not readable: {e})")
    return "\n".join(parts)


def _check_output(e2e: E2E, namespace: str, pod: str) -> dict[str, Any]:
    """cuda-check's one JSON line from the pod's log."""
    log = e2e.pod_logs(namespace, pod, "cuda-check")
    lines = [line for line in log.splitlines() if line.startswith("{")]
    assert len(lines) == 1, f"{pod}: cuda-check printed no JSON report\n{_report(e2e, namespace, pod)}"
    result: dict[str, Any] = json.loads(lines[0])
    return result


def _exit_code(pod: Any, container: str) -> int | None:
    for status in pod.status.container_statuses or []:
        if status.name == container and status.state.terminated is not None:
            return int(status.state.terminated.exit_code)
    return None


def _cdi_edits(path: str) -> list[dict[str, Any]]:
    """The spec's containerEdits: the spec-wide ones and each device's."""
    with open(path) as f:
        spec = json.load(f) if path.endswith(".json") else yaml.safe_load(f)
    edits = [spec.get("containerEdits") or {}]
    edits += [d.get("containerEdits") or {} for d in spec.get("devices") or []]
    return edits


def _claimed_device(e2e: E2E, namespace: str, pod: str) -> tuple[Any, str] | None:
    """(the pod's allocated claim, its CDI spec file on the node) once both exist, else None."""
    statuses = e2e.pod(namespace, pod).status.resource_claim_statuses or []
    if not statuses or not statuses[0].resource_claim_name:
        return None
    claim = e2e.resource.read_namespaced_resource_claim(statuses[0].resource_claim_name, namespace)
    if claim.status is None or claim.status.allocation is None:
        return None
    specs = glob.glob(os.path.join(e2e.cdi_dir, f"*{claim.metadata.uid}*"))
    return (claim, specs[0]) if specs else None


def test_pods_load_libcuda_through_the_cdi_spec_in_both_image_layouts(e2e: E2E, namespace: str) -> None:
    assert e2e.driver_root, "the session has no fake driver root (conftest.py)"
    driver_lib = f"{e2e.driver_root}{LIB_DIR}/libcuda.so.{FAKE_DRIVER_VERSION}"
    e2e.apply(CLAIM_TEMPLATE, namespace)
    for manifest in (*GPU_PODS.values(), NO_GPU_POD):  # all at once: they run side by side
        e2e.core.create_namespaced_pod(namespace, manifest)

    # While each GPU pod holds its claim: the plugin's CDI spec for it mounts the driver's libcuda
    # (the real file under the driver root, at its SONAME) and nvidia-smi, with the loader-cache hook.
    prepared: dict[str, tuple[Any, str]] = {}

    def all_prepared() -> bool:  # all pods in one loop: their windows overlap, none waits on another
        for pod in GPU_PODS:
            if pod not in prepared and (found := _claimed_device(e2e, namespace, pod)):
                prepared[pod] = found
        return len(prepared) == len(GPU_PODS)

    try:
        wait_for("each GPU pod's claim to be allocated and prepared (its CDI spec on the node)", all_prepared, 60)
    except AssertionError as e:
        missing = [p for p in GPU_PODS if p not in prepared]
        raise AssertionError(f"{e}: not {missing}\nCDI specs: {e2e.cdi_spec_files()}\n"
                             + "\n".join(_report(e2e, namespace, p) for p in missing)) from None
    minors: dict[str, int] = {}
    for pod, (claim, spec_path) in prepared.items():
        [result] = claim.status.allocation.devices.results
        minors[pod] = e2e.slice_devices()[result.device]["attributes"]["minor"]["int"]
        edits = _cdi_edits(spec_path)
        mounts = {m.get("containerPath"): m.get("hostPath") for e in edits for m in e.get("mounts") or []}
        assert mounts.get(CONTAINER_LIBCUDA) == driver_lib, (
            f"{pod}: the CDI spec does not mount the driver's libcuda at {CONTAINER_LIBCUDA}: {mounts}")
        assert mounts.get("/usr/bin/nvidia-smi") == f"{e2e.driver_root}/usr/bin/nvidia-smi", (
            f"{pod}: the CDI spec does not mount the driver's nvidia-smi: {mounts}")
        hooks = [h for e in edits for h in e.get("hooks") or []]
        assert [h for h in hooks if h.get("hookName") == "createContainer"
                and "/usr/local/nvidia/lib64" in (h.get("args") or [])], (
            f"{pod}: the CDI spec has no createContainer hook adding /usr/local/nvidia/lib64 to the "
            f"loader cache: {hooks}")

    # Each GPU pod's program found libcuda where gpuready mounted it, through the image's own loader
    # search, and the fake driver's cuInit answered: the pod fails with cuda-check's "CUDA failed".
    for pod, manifest in GPU_PODS.items():
        ended = e2e.wait_pod_phase(namespace, pod, "Failed", timeout=60 + HOLD_SECONDS)
        report = _check_output(e2e, namespace, pod)
        where = f"{pod} ({manifest['spec']['containers'][0]['image']}): {report}\n{_report(e2e, namespace, pod)}"
        assert report["libcuda"] == CONTAINER_LIBCUDA, f"libcuda.so.1 was not loaded from the CDI mount: {where}"
        assert (report["cuInit"], report["cuInit_name"]) == (CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE"), (
            f"not the fake driver's cuInit: {where}")
        assert _exit_code(ended, "cuda-check") == EXIT_CUDA_FAILED, f"want exit code 3: {where}"
        gpu_nodes = [n for n in report["dev_nodes"] if n.removeprefix("/dev/nvidia").isdigit()]
        assert gpu_nodes == [f"/dev/nvidia{minors[pod]}"], f"not exactly the claimed GPU's device node: {where}"
        assert "/dev/nvidiactl" in report["dev_nodes"], f"no /dev/nvidiactl: {where}"
        want_uid = (manifest["spec"].get("securityContext") or {}).get("runAsUser", 0)
        assert report["uid"] == want_uid, f"ran as uid {report['uid']}, want {want_uid}: {where}"
        if any(c["name"] == "nvidia-smi" for c in manifest["spec"]["containers"]):
            # The driver's tool, mounted at /usr/bin, runs in an image that has none.
            smi = e2e.pod_logs(namespace, pod, "nvidia-smi")
            assert (_exit_code(ended, "nvidia-smi"), smi.strip()) == (0, NVIDIA_SMI_OUTPUT), (
                f"nvidia-smi from the driver root did not run: {where}")

    # Without a claim, nothing of the driver: no libcuda for the loader, no device node.
    ended = e2e.wait_pod_phase(namespace, "cuda-no-claim", "Succeeded", timeout=60)
    report = _check_output(e2e, namespace, "cuda-no-claim")
    where = f"cuda-no-claim: {report}\n{_report(e2e, namespace, 'cuda-no-claim')}"
    assert (report["libcuda"], report["dev_nodes"]) == (None, []), f"a pod without a claim got the driver: {where}"
    assert _exit_code(ended, "cuda-check") == 0, where
