"""``gpuready demo`` stopped by a signal, as a user's terminal or a process manager stops it: a real
subprocess, a real SIGTERM or SIGINT. Every component stops, the work directory (sockets, the
webhook's TLS key) goes, one line says so, and the exit status is the conventional one: 128 + the
signal in the middle of the story, 0 for ``--serve``, whose documented way to stop is a signal."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import pytest

TIMEOUT = 150  # the demo takes ~5 s here; generous for a loaded 2-core machine


def _children(pid: int) -> list[int]:
    """Processes whose parent is ``pid`` (from /proc)."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(entry))
    return out


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _start(*flags: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "dra_driver", "demo", *flags], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})


def _read_until(proc: subprocess.Popen[str], marker: str) -> str:
    """The demo's output up to and including the first line containing ``marker``."""
    assert proc.stdout is not None
    lines: list[str] = []
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if marker in line:
            return "".join(lines)
    proc.kill()
    pytest.fail(f"the demo never printed {marker!r}:\n{''.join(lines)}")


@pytest.mark.parametrize("flags, sig, status, marker", [
    ((), signal.SIGTERM, 143, "[3/8]"),
    ((), signal.SIGINT, 130, "[3/8]"),
    (("--serve",), signal.SIGTERM, 0, "Component logs:"),
], ids=["plain-sigterm", "plain-sigint", "serve-sigterm"])
def test_a_signal_stops_every_part_and_removes_the_work_directory(
        flags: tuple[str, ...], sig: signal.Signals, status: int, marker: str) -> None:
    proc = _start(*flags)
    try:
        before = _read_until(proc, marker)
        workdir = re.search(r"work directory: (\S+)", before)
        assert workdir, before
        # What a kill used to leave behind: the plugins' sockets and the webhook's private key.
        assert os.path.exists(os.path.join(workdir.group(1), "webhook-tls", "tls.key"))
        assert os.path.exists(os.path.join(workdir.group(1), "node-a", "plug", "dra.sock"))
        children = _children(proc.pid)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == status, f"{out}\n{err}"
    assert not os.path.exists(workdir.group(1)), f"{workdir.group(1)} left behind:\n{out}"
    assert [c for c in children if _alive(c)] == []
    said = [line for line in out.splitlines() if line.startswith("stopped on ")]
    assert said == [f"stopped on {sig.name}: every component is stopped and the work directory "
                    f"{workdir.group(1)} is removed"], out
    assert "Traceback" not in out + err and err.strip() == "", err


def test_keep_keeps_the_work_directory_after_a_signal() -> None:
    proc = _start("--keep")
    try:
        before = _read_until(proc, "[2/8]")
        workdir = re.search(r"work directory: (\S+)", before)
        assert workdir, before
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    try:
        assert proc.returncode == 143, out
        assert os.path.exists(os.path.join(workdir.group(1), "components.log"))
        assert f"the work directory {workdir.group(1)} is kept (--keep)" in out
    finally:
        import shutil

        shutil.rmtree(workdir.group(1), ignore_errors=True)


def _wrapping_story(p: object, cluster: object, args: object) -> None:
    """A step inside a library that turns whatever it catches into its own error, as pydantic does
    with an exception raised while it builds a validator (seen under load: 'SchemaError: ...
    Stopped: SIGTERM')."""
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler runs here
    except BaseException as exc:
        raise RuntimeError(f"Error building validator: {exc}") from None


def _swallowing_story(p: object, cluster: object, args: object) -> None:
    """A library that swallows everything, then the story waits for something."""
    from testbed.demo.cluster import wait_for

    try:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
    except BaseException:
        pass
    wait_for(lambda: False, "something that never comes", timeout=5)


@pytest.mark.parametrize("story", [_wrapping_story, _swallowing_story], ids=["wrapped", "swallowed"])
def test_a_signal_a_library_wraps_or_swallows_still_stops_the_demo(
        story: object, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import argparse

    from testbed.demo import demo_command

    monkeypatch.setattr(demo_command, "_story", story)
    args = argparse.Namespace(scenario="xid79", serve=False, quiet=True, hold_down=1.0, keep=False)
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    status = demo_command.run(args)
    out = capsys.readouterr().out
    assert status == 143, out
    assert "DEMO FAILED" not in out
    assert "stopped on SIGTERM: every component is stopped and no work directory had been made" in out
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before  # handlers restored
