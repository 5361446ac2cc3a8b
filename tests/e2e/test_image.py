"""The gpuready image as the chart runs it, on the real cluster: built here without any registry
(testbed/realcluster/build-image.sh: Debian's packages, the Dockerfile's recipe), imported into the
cluster's containerd with ``ctr images import``, and run by the kubelet as one-shot pods with
``imagePullPolicy: Never``: the entrypoint lists the subcommands, the controller's user starts on a
read-only root without compiling anything, and the plugin's private /dev/shm for MPS daemons works
with the image's own ``unshare`` and ``mount``. And the image holds what production needs only,
and the same inputs build the same bytes."""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import pytest
from e2e_support import E2E, wait_for

from dra_driver.cli import SUBCOMMANDS
from kubelet_plugin.mps.control_daemon import _PRIVATE_SHM_SCRIPT  # the exact script the plugin runs
from testbed.realcluster import gpuready_image, images, oci_layout
from testbed.realcluster.procs import run

# A cold build takes about a minute on two cores (then cached); the rebuild test takes as long.
pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("realcluster"), pytest.mark.timeout(600)]

IMAGE = gpuready_image.image_name()
SITE = "usr/local/lib/python3.11/dist-packages"


@pytest.fixture(scope="module")
def archive() -> str:
    """The production image's archive (built, or found in the cache)."""
    path = gpuready_image.build()
    oci_layout.validate_archive(path)
    return path


@pytest.fixture(scope="module")
def imported(e2e: E2E, archive: str) -> Iterator[str]:
    """The image imported into the cluster's containerd, under the name the archive gives it."""
    t0 = time.monotonic()
    images.import_archive(e2e.cluster.bins.ctr, e2e.cluster.containerd_socket, archive)
    listed = run([e2e.cluster.bins.ctr, "--address", e2e.cluster.containerd_socket, "--namespace", "k8s.io",
                  "images", "ls", "-q"], "ctr images ls").split()
    assert IMAGE in listed, f"ctr images import did not name the image {IMAGE}: {listed}"
    print(f"\nimported {os.path.basename(archive)} ({os.path.getsize(archive) / 1e6:.0f} MB) in "
          f"{time.monotonic() - t0:.1f}s")
    yield IMAGE


def run_once(e2e: E2E, namespace: str, name: str, container: dict[str, Any], timeout: float = 120) -> tuple[int, str]:
    """Run one container of the gpuready image to its end; return (exit code, log)."""
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
           "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
                    "containers": [{"name": "main", "image": IMAGE, "imagePullPolicy": "Never", **container}]}}
    e2e.apply(json.dumps(pod), namespace)

    def ended() -> Any:
        status = e2e.pod(namespace, name).status
        for cs in status.container_statuses or []:
            if cs.state and cs.state.terminated:
                return cs.state.terminated
            waiting = cs.state.waiting if cs.state else None
            if waiting and waiting.reason in ("ErrImageNeverPull", "CreateContainerError", "InvalidImageName"):
                raise AssertionError(f"{name}: {waiting.reason}: {waiting.message}")
        return None

    try:
        terminated = wait_for(f"pod {namespace}/{name} to end", ended, timeout)
    except AssertionError as e:
        raise AssertionError(f"{e}\n{e2e.describe_pod(namespace, name)}") from None
    return int(terminated.exit_code), e2e.pod_logs(namespace, name)


def test_the_entrypoint_lists_the_production_subcommands_and_no_testbed_ones(
        e2e: E2E, namespace: str, imported: str) -> None:
    code, log = run_once(e2e, namespace, "help", {"args": ["--help"]})
    assert code == 0, log
    # argparse lists each subcommand on a line of its own, indented four spaces. The testbed's (demo,
    # local-apiserver) come from entry points the image's wheel names but whose package it leaves
    # out: the CLI skips them rather than listing them as unavailable.
    listed = re.findall(r"^    ([a-z][\w-]*)(?:\s|$)", log, re.M)
    assert listed == list(SUBCOMMANDS), f"gpuready --help lists {listed}, want {list(SUBCOMMANDS)}:\n{log}"
    assert "unavailable" not in log, log
    assert "gpuready demo" not in log, f"the help points at a demo the image does not have:\n{log}"
    code, log = run_once(e2e, namespace, "plugin-help", {"args": ["kubelet-plugin", "--help"]})
    assert code == 0 and "--node-name" in log, log


def test_the_controllers_user_starts_on_a_read_only_root_from_bytecode(e2e: E2E, namespace: str, imported: str) -> None:
    # As the chart runs the controller: uid/gid 65532, read-only root filesystem. python -v names
    # every module: "code object from <...>.pyc" when it loads bytecode, "<...>.py" when it compiles.
    script = ("id -u; id -g; id -un; "
              "python3 -v -c 'import time; t = time.perf_counter(); import kubelet_plugin.daemon, controller.daemon; "
              "print(\"imported in\", round(time.perf_counter() - t, 3))' 2>&1")
    code, log = run_once(e2e, namespace, "bytecode", {
        "command": ["sh", "-c", script],
        "securityContext": {"runAsUser": 65532, "runAsGroup": 65532, "readOnlyRootFilesystem": True,
                            "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}})
    assert code == 0, log[-3000:]
    assert log.splitlines()[:3] == ["65532", "65532", "gpuready"], log[:500]
    loaded = [line for line in log.splitlines() if line.startswith("# code object from ")]
    compiled = [line for line in loaded if not line.rstrip("'").endswith(".pyc")]
    ours = [line for line in loaded if "/dra_driver/" in line or "/kubelet_plugin/" in line or "/controller/" in line]
    assert len(ours) > 50, f"python -v did not report gpuready's modules loading: {loaded[:5]}"
    assert compiled == [], f"compiled at start instead of loading the image's bytecode: {compiled[:10]}"
    print(next(line for line in log.splitlines() if line.startswith("imported in")))


def test_the_plugins_private_shm_for_mps_works_with_the_images_unshare_and_mount(
        e2e: E2E, namespace: str, imported: str) -> None:
    # What kubelet_plugin/mps/control_daemon.py runs before an MPS control daemon (privileged, as
    # the chart's plugin): a mount namespace whose /dev/shm is the claim's directory. The daemon is
    # replaced by a shell that writes into /dev/shm; the file must land in the claim's directory.
    claim_dir = "/tmp/claim-shm"
    inner = "touch /dev/shm/written-by-daemon && echo bound"
    command = ["sh", "-c", f"mkdir -p {claim_dir} && unshare --mount --propagation private -- sh -c "
               f"'{_PRIVATE_SHM_SCRIPT}' {claim_dir} sh -c \"{inner}\" && ls {claim_dir} && "
               f"! ls /dev/shm/written-by-daemon 2>/dev/null && echo host-shm-untouched"]
    code, log = run_once(e2e, namespace, "mps-shm", {"command": command, "securityContext": {"privileged": True}})
    assert code == 0, log
    assert log.split() == ["bound", "written-by-daemon", "host-shm-untouched"], log


def test_the_image_holds_production_code_compiled_and_none_of_the_build(archive: str) -> None:
    base = set(oci_layout.iter_layer_names(archive, 0))
    app = set(oci_layout.iter_layer_names(archive, 1))
    names = base | app
    for package in ("dra_driver", "kubelet_plugin", "controller", "proto", "kubernetes", "grpc", "celpy"):
        assert f"{SITE}/{package}/__init__.py" in app, package
    assert "usr/local/bin/gpuready" in app and "usr/bin/python3" in base and "usr/bin/unshare" in base
    left_out = [n for n in names if n.startswith((f"{SITE}/testbed", f"{SITE}/pip/", f"{SITE}/kubernetes/aio/",
                                                   f"{SITE}/cryptography/", f"{SITE}/aiohttp/", "etc/apt/", "tmp/",
                                                   "dev/", "usr/share/man/", "usr/share/locale/"))]
    assert left_out == [], left_out[:10]
    docs = [n for n in names if n.startswith("usr/share/doc/") and not n.endswith(("/copyright", "/"))
            and n.count("/") > 3]
    assert docs == [], docs[:10]
    assert not [n for n in app if not n.startswith("usr/local")], "the app layer writes outside /usr/local"
    # Every module has its bytecode beside it (unchecked-hash .pyc in __pycache__).
    sources = [n for n in names if n.endswith(".py") and (n.startswith(SITE) or n.startswith("usr/lib/python3.11/"))]
    missing = [s for s in sources if
               f"{os.path.dirname(s)}/__pycache__/{os.path.basename(s)[:-3]}.cpython-311.pyc" not in names]
    assert len(sources) > 1000 and missing == [], missing[:10]
    info = oci_layout.validate_archive(archive)
    assert info.config["config"]["Entrypoint"] == ["gpuready"] and info.name == IMAGE
    print(f"\nimage {IMAGE}: layers {[round(s / 1e6, 1) for s in info.layer_sizes]} MB, "
          f"{sum(info.layer_sizes) / 1e6:.0f} MB in all")


def test_the_same_inputs_build_the_same_image_bytes(archive: str) -> None:
    # Everything again but the downloads (the base from mmdebstrap, the wheel, the install), into an
    # empty directory: the archive must be the cached one, byte for byte.
    work = tempfile.mkdtemp(prefix="gpuready-rebuild-", dir=os.path.dirname(archive))
    try:
        t0 = time.monotonic()
        again = gpuready_image.build(images=work)
        print(f"\nrebuilt from nothing in {time.monotonic() - t0:.0f}s")
        assert os.path.basename(again) == os.path.basename(archive)
        assert oci_layout.sha256_file(again) == oci_layout.sha256_file(archive)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def test_the_testbed_tag_adds_the_simulated_nvml_in_one_labelled_layer(archive: str) -> None:
    testbed = gpuready_image.build(testbed=True)
    info, production = oci_layout.validate_archive(testbed), oci_layout.validate_archive(archive)
    assert info.name == gpuready_image.image_name(testbed=True) == IMAGE + "-testbed"
    assert info.manifest["layers"][:2] == production.manifest["layers"]  # the production image, unchanged
    added = list(oci_layout.iter_layer_names(testbed, 2))
    assert f"{SITE}/testbed/nvml_sim/__init__.py" in added
    assert f"{SITE}/testbed/crash_points.py" in added  # armed through the fault channel (test_plugin_restarts)
    assert not [n for n in added if n != SITE and not n.startswith(f"{SITE}/testbed")], added[:10]
    assert not [n for n in added if n.startswith((f"{SITE}/testbed/realcluster", f"{SITE}/testbed/demo"))]
    assert info.config["config"]["Labels"]["org.opencontainers.image.description"].startswith("TEST ONLY")

