"""The step list (kubelet_plugin/prepare/steps.py) cannot drift from the code: every step's method
exists, and one prepare and unprepare of a claim that needs everything (a dynamic MIG slice with MPS)
reaches each step, in the listed order. A crash test that stops at each listed step therefore stops
at every write."""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterator
from typing import Any

import pytest

from dra_driver.opaque_config import API_VERSION
from kubelet_plugin.prepare.steps import PREPARE_STEPS, STEPS, UNPREPARE_STEPS, step_named
from testbed.crash_points import main as crash_main
from testbed.crash_points import parse_point
from testbed.fake_mps_control import events, write_fake
from testbed.plugin_harness import PluginHarness, opaque

NODE = "steps-node"
MPS = opaque({"apiVersion": API_VERSION, "kind": "MigDeviceConfig",
              "sharing": {"strategy": "MPS", "mps": {"defaultActiveThreadPercentage": 50}}})


def _owner(target: str) -> tuple[Any, str]:
    module_name, _, attribute = target.partition(":")
    class_name, _, method = attribute.partition(".")
    return getattr(importlib.import_module(module_name), class_name), method


@pytest.fixture
def reached(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Every step's method wrapped to append its name when called."""
    seen: list[str] = []
    for step in STEPS:
        owner, method = _owner(step.target)
        original = getattr(owner, method)

        def counted(*args: Any, _name: str = step.name, _original: Any = original, **kwargs: Any) -> Any:
            seen.append(_name)
            return _original(*args, **kwargs)

        monkeypatch.setattr(owner, method, counted)
    yield seen


def test_every_step_names_a_method_and_is_unique() -> None:
    assert len({s.name for s in STEPS}) == len(STEPS)
    for step in STEPS:
        owner, method = _owner(step.target)
        assert callable(getattr(owner, method, None)), step


def test_one_prepare_and_unprepare_reach_every_step_in_order(reached: list[str], tmp_path: Any,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir = os.path.dirname(write_fake(str(tmp_path / "bin")))
    monkeypatch.setenv("PATH", bin_dir + os.pathsep + os.environ["PATH"])
    monkeypatch.setenv("FAKE_MPS_RECORD", str(tmp_path / "mps.jsonl"))
    monkeypatch.delenv("MPS_CONTROL_PATH", raising=False)
    with PluginHarness() as h:
        h.start_plugin(NODE, "sim:4xh200", mig_mode="dynamic", mps_root=os.path.join(h.root, "mps"))  # short: a socket path has at most 107 bytes
        device = next(n for n, d in h.published_devices(NODE).items()
                      if d.get("attributes", {}).get("profile", {}).get("string") == "1g.18gb")
        uid = h.create_claim("c1", [("gpu", NODE, device)], config=[MPS])
        kubelet = h.kubelet(NODE)
        result = kubelet.prepare([("default", "c1", uid)])[uid]
        assert result.ok, result.error
        assert kubelet.unprepare([("default", "c1", uid)]) == {uid: ""}
    assert [s for s in dict.fromkeys(reached)] == [s.name for s in PREPARE_STEPS + UNPREPARE_STEPS]
    assert [e for e in events(str(tmp_path / "mps.jsonl")) if e["kind"] == "exit"]  # the daemon was stopped


def test_a_bad_crash_point_names_the_form_and_the_known_steps(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ValueError, match="before:<step> or after:<step>"):
        parse_point("during:write_cdi_spec")
    with pytest.raises(ValueError, match="known: record_intent, create_mig"):
        step_named("write_cdi")
    with pytest.raises(SystemExit):
        crash_main(["--pause-at", "after:nope", "/tmp/marker", "--", "version"])
    assert "--pause-at: unknown prepare/unprepare step 'nope'" in capsys.readouterr().err
