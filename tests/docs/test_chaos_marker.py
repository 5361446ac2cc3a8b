"""The chaos cases stop the kubelet, the API server and etcd of the session's cluster and take
minutes: only ``-m chaos`` runs them, never the unit run (``-m 'not e2e'``), CI's e2e run
(``-m e2e``) or plain ``pytest`` (tests/conftest.py deselects them)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _collected(*args: str) -> list[str]:
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-n", "0", "-p", "no:cacheprovider",
                          *args, "tests/e2e"], capture_output=True, text=True, cwd=ROOT, check=False)
    return [line for line in out.stdout.splitlines() if "::" in line]


@pytest.mark.parametrize("select", [("-m", "e2e"), ("-m", "not e2e"), ()], ids=["e2e", "not-e2e", "plain"])
def test_no_other_selection_picks_up_the_chaos_cases(select: tuple[str, ...]) -> None:
    collected = _collected(*select)
    assert not [t for t in collected if "test_chaos_" in t]
    if select == ("-m", "e2e"):
        assert collected, "the e2e suite itself is still collected"


def test_dash_m_chaos_runs_exactly_the_chaos_cases() -> None:
    collected = _collected("-m", "chaos")
    assert collected and all("test_chaos_" in t for t in collected), collected
