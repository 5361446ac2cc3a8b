"""Every log event of the kubelet plugin carries the fields an operator filters on.

A node's logs are read merged with other nodes' (a log pipeline), so every event names its node;
events about a claim name the claim UID, and events about a MIG device name the device. Checked on
the source, so a new log call without them fails here before anyone has to grep for it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "kubelet_plugin"
LEVELS = {"debug", "info", "warning", "error"}
# NVML discovery and the health monitor do not know the node's name: the daemon sets ``node`` for the
# whole process (dra_driver.logs.set_process_fields), so their events carry it without naming it.
NODE_FROM_PROCESS = ("kubelet_plugin/nvml/", "kubelet_plugin/health/")


def _log_calls() -> list[tuple[str, str, set[str]]]:
    """(file:line, event, keyword names) of every ``log.<level>("event", ...)`` call."""
    calls = []
    for path in sorted(ROOT.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in LEVELS and isinstance(node.func.value, ast.Name)
                    and node.func.value.id == "log" and node.args
                    and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
                where = f"{path.relative_to(ROOT.parent)}:{node.lineno}"
                calls.append((where, node.args[0].value, {k.arg for k in node.keywords if k.arg}))
    return calls


CALLS = _log_calls()


def test_the_plugin_has_log_calls_to_check() -> None:
    assert len(CALLS) > 30


@pytest.mark.parametrize(("where", "event", "fields"), CALLS, ids=[f"{c[0]}:{c[1]}" for c in CALLS])
def test_every_event_names_its_node_and_its_claim_or_device(where: str, event: str, fields: set[str]) -> None:
    if not where.startswith(NODE_FROM_PROCESS):
        assert "node" in fields, f"{where}: {event} has no node= field"
    if event.startswith("claim_"):
        assert "claim_uid" in fields, f"{where}: {event} has no claim_uid= field"
    if event.startswith("mig_"):
        assert "device" in fields, f"{where}: {event} has no device= field"
