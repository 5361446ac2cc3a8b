"""Fixtures the node daemon's tests share."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from typing import Any

import pytest

from kubelet_plugin.mps.mps_dirs import daemon_alive
from testbed.fake_mps_control import events, write_fake


@pytest.fixture
def fake_mps(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The stand-in MPS control on PATH (testbed/fake_mps_control.py); yields its record file; any daemon
    it left is killed at the end."""
    bin_dir = str(tmp_path / "bin")
    write_fake(bin_dir)
    record = str(tmp_path / "record.jsonl")
    monkeypatch.setenv("FAKE_MPS_RECORD", record)
    monkeypatch.setenv("PATH", bin_dir + os.pathsep + os.environ.get("PATH", ""))
    monkeypatch.delenv("MPS_CONTROL_PATH", raising=False)
    yield record
    for e in events(record):
        if e["kind"] == "daemon" and daemon_alive(e["pid"]):
            os.kill(e["pid"], signal.SIGKILL)
