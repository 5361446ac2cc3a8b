"""``gpuready demo --serve`` as a user tries it next: ``kubectl get nodes``, then ``kubectl apply -f``
of each of deploy/examples/, through the real ``kubernetes`` client against the cluster the demo
left up. Each example's pod must reach Running on a node whose kubelet prepared its claim (the CDI
spec is on disk), and deleting it must unprepare the claim (the spec is gone)."""

from __future__ import annotations

import contextlib
import copy
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, config

from kubelet_plugin.cdi.cdi_spec import spec_file_name

EXAMPLES = Path(__file__).resolve().parents[3] / "deploy" / "examples"
LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"
TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io"
DRIVER = "gpu.nvidia.com"


@contextlib.contextmanager
def served() -> Iterator[dict[str, Any]]:
    """A ``gpuready demo --serve`` subprocess, its API client and work directory; SIGTERM at the end."""
    proc = subprocess.Popen([sys.executable, "-m", "dra_driver", "demo", "--serve", "--quiet"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert proc.stdout is not None
    lines: list[str] = []
    deadline = time.monotonic() + 150
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if line.startswith("Component logs:"):
            break
    text = "".join(lines)
    kubeconfig = re.search(r"export KUBECONFIG=(\S+)", text)
    workdir = re.search(r"work directory: (\S+)", text)
    if not kubeconfig or not workdir:
        proc.kill()
        pytest.fail(f"the demo did not come up:\n{text}\n{proc.communicate()}")
    try:
        yield {"api": config.new_client_from_config(config_file=kubeconfig.group(1)),
               "workdir": workdir.group(1), "text": text}
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, f"{out}\n{err}"


def _wait(what: str, check: Callable[[], Any], timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.1)


def _calls(api: Any, kind: str) -> tuple[Callable[..., Any], Callable[..., Any], Callable[..., Any], Callable[..., Any]]:
    core, res = client.CoreV1Api(api), client.ResourceV1Api(api)
    return {
        "Pod": (core.read_namespaced_pod, core.create_namespaced_pod, core.patch_namespaced_pod,
                core.delete_namespaced_pod),
        "ResourceClaim": (res.read_namespaced_resource_claim, res.create_namespaced_resource_claim,
                          res.patch_namespaced_resource_claim, res.delete_namespaced_resource_claim),
        "ResourceClaimTemplate": (res.read_namespaced_resource_claim_template,
                                  res.create_namespaced_resource_claim_template,
                                  res.patch_namespaced_resource_claim_template,
                                  res.delete_namespaced_resource_claim_template),
    }[kind]


def kubectl_apply(api: Any, obj: dict[str, Any]) -> None:
    """What ``kubectl apply`` (client-side) sends: the object with its last-applied annotation,
    created when it does not exist, patched when it does (where a claim's spec is immutable)."""
    body = copy.deepcopy(obj)
    body["metadata"].setdefault("annotations", {})[LAST_APPLIED] = json.dumps(obj, sort_keys=True)
    read, create, patch, _ = _calls(api, obj["kind"])
    name, ns = obj["metadata"]["name"], obj["metadata"].get("namespace", "default")
    try:
        read(name, ns)
    except client.ApiException as exc:
        if exc.status != 404:
            raise
        create(ns, body)
        return
    patch(name, ns, body)


def kubectl_delete(api: Any, obj: dict[str, Any]) -> None:
    """``kubectl delete -f``: each object of the file."""
    _calls(api, obj["kind"])[3](obj["metadata"]["name"], obj["metadata"].get("namespace", "default"))


def _json(response: Any) -> Any:
    return json.loads(response.data)


def _pod(api: Any, name: str) -> dict[str, Any]:
    result: dict[str, Any] = _json(client.CoreV1Api(api).read_namespaced_pod(name, "default", _preload_content=False))
    return result


def _claims_of(api: Any, pod: dict[str, Any]) -> list[dict[str, Any]]:
    recorded = {s["name"]: s.get("resourceClaimName") for s in pod["status"].get("resourceClaimStatuses") or []}
    names = [e.get("resourceClaimName") or recorded.get(e["name"]) for e in pod["spec"]["resourceClaims"]]
    res = client.ResourceV1Api(api)
    return [_json(res.read_namespaced_resource_claim(n, "default", _preload_content=False)) for n in names]


def _kubectl_get_nodes(api: Any) -> dict[str, str]:
    """Node -> STATUS, from the server's Table, which is what ``kubectl get nodes`` prints."""
    response = api.call_api("GET", api.configuration.host + "/api/v1/nodes", header_params={"Accept": TABLE})
    response.read()
    table = json.loads(response.data)
    status_column = [c["name"] for c in table["columnDefinitions"]].index("Status")
    return {r["object"]["metadata"]["name"]: r["cells"][status_column] for r in table["rows"]}


def _run_example(api: Any, workdir: str, example: str) -> None:
    """Apply ``example``, see its pod run with its claims prepared, delete it, see them unprepared."""
    objects = [d for d in yaml.safe_load_all((EXAMPLES / example).read_text()) if d]
    for obj in objects:
        kubectl_apply(api, obj)
    [pod_name] = [o["metadata"]["name"] for o in objects if o["kind"] == "Pod"]

    def running() -> dict[str, Any] | None:
        pod = _pod(api, pod_name)
        return pod if pod["status"].get("phase") == "Running" else None
    try:
        pod = _wait(f"pod {pod_name} of {example} to run", running)
    except BaseException:
        events = client.CoreV1Api(api).list_namespaced_event(
            "default", field_selector=f"involvedObject.name={pod_name}").items
        print(f"{pod_name}: {_pod(api, pod_name)['status']}\nEvents: {[(e.reason, e.message) for e in events]}")
        raise
    assert all(s["ready"] for s in pod["status"]["containerStatuses"])
    node = pod["spec"]["nodeName"]
    claims = _claims_of(api, pod)
    specs = [os.path.join(workdir, node, "cdi", spec_file_name(DRIVER, c["metadata"]["uid"])) for c in claims]
    assert claims and all(os.path.exists(s) for s in specs), f"{example}: no CDI spec on {node}: {specs}"
    for obj in reversed(objects):
        kubectl_delete(api, obj)
    _wait(f"{example}'s claims to be unprepared on {node}", lambda: not any(os.path.exists(s) for s in specs))


# One test, one served cluster: the demo is the costly part (and test workers must not each start one).
def test_nodes_are_ready_and_every_example_runs_on_the_served_cluster() -> None:
    with served() as demo:
        api, workdir = demo["api"], demo["workdir"]
        assert _kubectl_get_nodes(api) == {"node-a": "Ready", "node-b": "Ready"}
        examples = sorted(p.name for p in EXAMPLES.glob("*.yaml"))
        assert len(examples) >= 6
        for example in examples:
            _run_example(api, workdir, example)
