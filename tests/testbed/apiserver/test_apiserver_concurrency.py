"""Thread safety under the real client: concurrent writers and watchers. Every watcher must see events
in strictly increasing resourceVersion order and, replaying them, reach exactly the server's final state
(the property informers rely on)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client, watch

from testbed.apiserver import LocalApiServer
from testbed.apiserver.slice_samples import slice_body


@pytest.fixture
def srv() -> Iterator[LocalApiServer]:
    with LocalApiServer() as s:
        yield s


def test_concurrent_writers_and_watchers_agree(srv: LocalApiServer) -> None:
    start_rv = client.ResourceV1Api(srv.api_client()).list_resource_slice().metadata.resource_version
    states: list[dict[str, str]] = [{}, {}]
    rvs: list[list[int]] = [[], []]
    errors: list[BaseException] = []

    def watcher(i: int) -> None:
        api = client.ResourceV1Api(srv.api_client())
        try:
            for ev in watch.Watch().stream(api.list_resource_slice, resource_version=start_rv, timeout_seconds=60):
                obj: dict[str, Any] = ev["raw_object"]
                rvs[i].append(int(obj["metadata"]["resourceVersion"]))
                if ev["type"] == "DELETED":
                    states[i].pop(obj["metadata"]["name"], None)
                else:
                    states[i][obj["metadata"]["name"]] = obj["metadata"]["resourceVersion"]
        except BaseException as exc:
            errors.append(exc)

    def writer(t: int) -> None:
        api = client.ResourceV1Api(srv.api_client())
        try:
            for j in range(25):
                name = f"w{t}-{j % 6}"
                try:
                    s = api.read_resource_slice(name)
                    if j % 3 == 0:
                        api.delete_resource_slice(name)
                    else:
                        s.spec.pool.generation += 1
                        api.replace_resource_slice(name, s)
                except client.ApiException as exc:
                    if exc.status != 404:
                        raise
                    api.create_resource_slice(slice_body(name, node=f"node-{t}"))
        except BaseException as exc:
            errors.append(exc)

    watchers = [threading.Thread(target=watcher, args=(i,), daemon=True) for i in range(2)]
    for w in watchers:
        w.start()
    writers = [threading.Thread(target=writer, args=(t,), daemon=True) for t in range(4)]
    for w in writers:
        w.start()
    for w in writers:
        w.join(timeout=60)
    assert not errors, errors
    final = {s["metadata"]["name"]: s["metadata"]["resourceVersion"] for s in srv.store.list("resourceslices")}
    final_rv = srv.store.resource_version
    deadline = time.monotonic() + 20
    while any(not r or r[-1] < final_rv for r in rvs) and time.monotonic() < deadline:
        time.sleep(0.05)
    srv.faults.drop_watches()
    for w in watchers:
        w.join(timeout=10)
    assert not errors, errors
    for i in range(2):
        assert rvs[i] == sorted(set(rvs[i])), "events out of order or duplicated"
        assert states[i] == final
