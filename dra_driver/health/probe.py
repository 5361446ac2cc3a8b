"""Running the CUDA compute probe safely: in a child process, under a time limit.

:class:`CudaProber` probes a real GPU through ``libcuda.so.1`` (see :mod:`cuda_probe`);
:class:`SimulatedProber` asks the simulated NVML how its GPU should behave (``ok``, ``wrong``,
``hang``) and runs the same child process in simulation mode, so the timeout-and-kill path is the
real one. Both return a :class:`ProbeResult`; neither raises for a GPU problem.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from dra_driver.health.topology import ProbeTarget
from dra_driver.logs import get_logger

log = get_logger(__name__)

CUDA_PROBE_SCRIPT = str(Path(__file__).with_name("cuda_probe.py"))


@dataclass(frozen=True)
class ProbeResult:
    """The outcome of one probe, in words."""

    ok: bool
    reason: str  # "probe ok in 0.37s on NVIDIA H200" / "probe timed out after 30s"
    code: str  # CamelCase: "ProbeOk", "ProbeFailed", "ProbeTimedOut"
    seconds: float


class Prober(Protocol):
    """Something that can tell whether a probe target computes."""

    def probe(self, target: ProbeTarget, timeout_s: float) -> ProbeResult:
        """Probe one target within ``timeout_s``; never raise for a GPU problem."""
        ...


def _reap_later(proc: subprocess.Popen[str]) -> None:
    # A child stuck in the kernel (D state) may not die at once: reap it in the background rather
    # than block the caller, who must report the timeout now.
    threading.Thread(target=proc.wait, name="probe-reaper", daemon=True).start()


def run_probe_process(args: list[str], env: dict[str, str], timeout_s: float) -> ProbeResult:
    """Run the probe script with ``args``; kill it (its whole process group) at ``timeout_s``."""
    start = time.monotonic()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-I", "-S", CUDA_PROBE_SCRIPT, *args],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True,
            start_new_session=True,  # its own process group: the kill reaches anything it spawned
        )
    except OSError as exc:
        return ProbeResult(False, f"could not start the probe: {exc}", "ProbeFailed", 0.0)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            proc.communicate(timeout=1.0)
        except subprocess.TimeoutExpired:
            _reap_later(proc)
        return ProbeResult(False, f"probe timed out after {timeout_s:g}s", "ProbeTimedOut",
                           time.monotonic() - start)
    elapsed = time.monotonic() - start
    lines = [ln for ln in out.splitlines() if ln.strip()]
    try:
        result = json.loads(lines[-1]) if lines else None
    except json.JSONDecodeError:
        result = None
    if not isinstance(result, dict):
        tail = (err.strip().splitlines() or ["no output"])[-1]
        return ProbeResult(False, f"probe exited with status {proc.returncode}: {tail}", "ProbeFailed",
                           elapsed)
    if result.get("ok"):
        device = result.get("device", "")
        return ProbeResult(True, f"probe ok in {elapsed:.2f}s" + (f" on {device}" if device else ""),
                           "ProbeOk", elapsed)
    return ProbeResult(False, f"probe failed: {result.get('error', 'unknown error')}", "ProbeFailed",
                       elapsed)


def nvml_only_result(target: ProbeTarget) -> ProbeResult:
    """The result for a target CUDA cannot reach (MIG on, no instance): NVML checks decide alone."""
    return ProbeResult(True, f"{target.label} has MIG enabled, so CUDA sees only its MIG devices: "
                       f"judged by NVML checks", "ProbeSkipped", 0.0)


class CudaProber:
    """Probe real GPUs through the CUDA driver API in a child process."""

    def probe(self, target: ProbeTarget, timeout_s: float) -> ProbeResult:
        """Run the CUDA probe on ``target`` with ``CUDA_VISIBLE_DEVICES`` naming only it."""
        if target.cuda_uuid is None:
            return nvml_only_result(target)
        env = dict(os.environ)
        env["CUDA_VISIBLE_DEVICES"] = target.cuda_uuid
        result = run_probe_process(["--uuid", target.cuda_uuid], env, timeout_s)
        log.debug("cuda_probe", device=target.label, ok=result.ok, reason=result.reason)
        return result


class _ProbeBehaviour(Protocol):
    def probe_behaviour(self, uuid: str) -> str: ...


class SimulatedProber:
    """Probe simulated GPUs: the simulated NVML says ok/wrong/hang; the child process acts it out."""

    def __init__(self, sim: _ProbeBehaviour) -> None:
        self._sim = sim

    def probe(self, target: ProbeTarget, timeout_s: float) -> ProbeResult:
        """Run the probe child in simulation mode with the behaviour the simulated NVML reports."""
        if target.cuda_uuid is None:
            return nvml_only_result(target)
        behaviour = self._sim.probe_behaviour(target.cuda_uuid)
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
        return run_probe_process(["--uuid", target.cuda_uuid, "--simulate", behaviour], env, timeout_s)


def prober_for(nvml: object) -> Prober:
    """The right prober for an NVML handle: simulated when it can report probe behaviour."""
    if hasattr(nvml, "probe_behaviour"):
        return SimulatedProber(nvml)  # type: ignore[arg-type]
    return CudaProber()
