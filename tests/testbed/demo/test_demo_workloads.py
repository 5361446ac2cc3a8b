"""The demo's own objects never take a name that deploy/examples/ uses: ``gpuready demo --serve``
leaves them in the cluster the user then applies the examples to, and ``kubectl apply`` of an
example whose name the demo already took patches the demo's object (``field is immutable`` for a
claim) instead of creating the example's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from testbed.demo.workloads import workloads

EXAMPLES = Path(__file__).resolve().parents[3] / "deploy" / "examples"


def _example_objects() -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for path in sorted(EXAMPLES.glob("*.yaml")):
        out.extend(d for d in yaml.safe_load_all(path.read_text()) if d)
    return out


def test_no_demo_object_shares_a_name_with_an_example() -> None:
    examples = _example_objects()
    assert len(examples) >= 12  # six examples, a claim or template and a pod each
    example_names = {str(o["metadata"]["name"]) for o in examples}
    demo_names = {str(o["metadata"]["name"]) for w in workloads() for o in w.objects}
    assert {w.pod for w in workloads()} <= demo_names
    # Any kind: a Pod and a claim of one name are different objects, but a user reading
    # "shared-20gi" in kubectl output would not know whose it is.
    assert demo_names & example_names == set()
