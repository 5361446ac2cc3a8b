"""Files the plugin writes are replaced atomically, and only asked to survive a reboot when they must.

Every checkpoint record carries the boot ID and a new boot drops it; CDI specs live on tmpfs; MIG
instances vanish with a reset. So prepare and unprepare do not fsync (1 ms each on a quiet disk, over
10 ms at p90 on a busy one); a SIGKILL at any point still leaves whole files (the page cache keeps
what the process wrote). Crash tests of prepare itself are in test_plugin_crash.py.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kubelet_plugin.cdi.cdi_spec import atomic_write, remove_file
from testbed.plugin_harness import PluginHarness


@pytest.fixture
def fsyncs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    real = os.fsync

    def counted(fd: int) -> None:
        calls.append(fd)
        real(fd)

    monkeypatch.setattr(os, "fsync", counted)
    return calls


def test_a_replaced_file_is_whole_and_no_temp_file_is_left(tmp_path: Path, fsyncs: list[int]) -> None:
    target = tmp_path / "spec.json"
    atomic_write(str(target), b"old")
    atomic_write(str(target), b"new" * 1000)
    assert target.read_bytes() == b"new" * 1000
    assert os.listdir(tmp_path) == ["spec.json"]
    assert fsyncs == []  # not asked to be durable
    atomic_write(str(target), b"durable", durable=True)
    assert len(fsyncs) == 2  # the file and its directory
    assert remove_file(str(target)) and not remove_file(str(target))


def test_prepare_and_unprepare_write_no_fsync(fsyncs: list[int]) -> None:
    with PluginHarness() as h:
        h.start_plugin("n1", "sim:h100-80gb")
        uid = h.create_claim("c", [("gpu", "n1", "gpu-0")])
        kubelet = h.kubelet("n1")
        fsyncs.clear()
        assert kubelet.prepare([("default", "c", uid)])[uid].ok
        assert h.cdi_files("n1") == [f"k8s.gpu.nvidia.com-claim_{uid}.json"]
        assert kubelet.unprepare([("default", "c", uid)])[uid] == ""  # no error
        assert h.cdi_files("n1") == []
        assert fsyncs == []
