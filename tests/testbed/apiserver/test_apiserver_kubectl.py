"""kubectl (when installed) works against the local API server unchanged: create, apply, label, get,
delete, and server-side validation errors naming the field."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from testbed.apiserver import LocalApiServer

KUBECTL = shutil.which("kubectl")
pytestmark = pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed")

SLICE = """\
apiVersion: resource.k8s.io/v1
kind: ResourceSlice
metadata:
  name: s1
spec:
  driver: gpu.example.com
  nodeName: n1
  pool: {name: n1, generation: 1, resourceSliceCount: 1}
  devices:
  - name: DEVICE
    attributes: {type: {string: gpu}}
"""


@pytest.fixture
def kubectl(tmp_path: Path) -> Iterator[tuple[LocalApiServer, Path]]:
    with LocalApiServer() as srv:
        yield srv, Path(srv.write_kubeconfig(str(tmp_path / "kubeconfig")))


def run(kc: Path, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    assert KUBECTL is not None
    env = {**os.environ, "KUBECONFIG": str(kc)}
    return subprocess.run([KUBECTL, *args], input=stdin, capture_output=True, text=True, env=env, timeout=60)


def test_kubectl_create_apply_get_delete(kubectl: tuple[LocalApiServer, Path]) -> None:
    srv, kc = kubectl
    assert run(kc, "create", "-f", "-", stdin="apiVersion: v1\nkind: Node\nmetadata: {name: n1}\n").returncode == 0
    assert run(kc, "label", "node", "n1", "gpu=yes").returncode == 0
    assert srv.store.get("nodes", None, "n1")["metadata"]["labels"] == {"gpu": "yes"}
    out = run(kc, "apply", "-f", "-", stdin=SLICE.replace("DEVICE", "gpu-0"))
    assert out.returncode == 0, out.stderr
    got = json.loads(run(kc, "get", "resourceslices", "-o", "json").stdout)
    assert [i["metadata"]["name"] for i in got["items"]] == ["s1"]
    assert run(kc, "delete", "resourceslice", "s1").returncode == 0
    assert srv.store.list("resourceslices") == []


def test_kubectl_shows_validation_error(kubectl: tuple[LocalApiServer, Path]) -> None:
    _, kc = kubectl
    out = run(kc, "apply", "-f", "-", stdin=SLICE.replace("DEVICE", "GPU_0"))
    assert out.returncode != 0
    assert 'The ResourceSlice "s1" is invalid: spec.devices[0].name' in out.stderr


def test_kubectl_get_prints_kind_columns(kubectl: tuple[LocalApiServer, Path]) -> None:
    _, kc = kubectl
    assert run(kc, "apply", "-f", "-", stdin=SLICE.replace("DEVICE", "gpu-0")).returncode == 0
    out = run(kc, "get", "resourceslices")
    assert out.returncode == 0, out.stderr
    header, row = out.stdout.splitlines()[:2]
    assert header.split() == ["NAME", "NODE", "DRIVER", "POOL", "AGE"]
    assert row.split()[:4] == ["s1", "n1", "gpu.example.com", "n1"]


def test_kubectl_server_side_apply_creates_then_updates(kubectl: tuple[LocalApiServer, Path]) -> None:
    srv, kc = kubectl
    for generation in (1, 2):
        doc = SLICE.replace("DEVICE", "gpu-0").replace("generation: 1", f"generation: {generation}")
        out = run(kc, "apply", "--server-side", "-f", "-", stdin=doc)
        assert out.returncode == 0, out.stderr
        assert srv.store.get("resourceslices", None, "s1")["spec"]["pool"]["generation"] == generation
