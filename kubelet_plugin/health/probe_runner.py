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

from dra_driver.logs import get_logger
from kubelet_plugin.health.topology import ProbeMode, ProbeTarget

log = get_logger(__name__)

CUDA_PROBE_SCRIPT = str(Path(__file__).with_name("cuda_probe.py"))


@dataclass(frozen=True)
class ProbeResult:
    """The outcome of one probe, in words."""

    ok: bool
    reason: str  # "probe ok in 0.37s on NVIDIA H200" / "probe timed out after 30s"
    code: str  # CamelCase: "ProbeOk", "ProbeFailed", "ProbeTimedOut", "NotProbed", "ProbeCovered"
    seconds: float
    # False: no CUDA ran (in use, unreachable, covered by its MIG devices). ``ok`` is then True only in
    # the sense "no fault found": callers must not report it as a passed probe.
    probed: bool = True


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


NOT_PROBED = "NotProbed"
COVERED = "ProbeCovered"


def not_probed(why: str) -> ProbeResult:
    """No CUDA ran, for the reason given (``why`` reads after "not probed: ")."""
    return ProbeResult(True, f"not probed: {why}", NOT_PROBED, 0.0, probed=False)


def unprobed_result(target: ProbeTarget) -> ProbeResult:
    """The result for a target without a CUDA device of its own, by its mode (no CUDA runs)."""
    if target.mode is ProbeMode.COVERED:
        return ProbeResult(True, f"{target.label} has MIG enabled: CUDA runs only in its MIG devices, each "
                           "probed on its own", COVERED, 0.0, probed=False)
    if target.mode is ProbeMode.IN_USE:
        return not_probed("in use by a claim's MIG instance (a probe never runs inside a tenant's instance)")
    if target.mode is ProbeMode.TEMPORARY:
        return not_probed("MIG enabled and no MIG device; only a temporary instance could be probed")
    return not_probed("MIG enabled and no MIG device, and no temporary instance may be made "
                      "(static MIG, or --no-temporary-mig)")


class CudaProber:
    """Probe real GPUs through the CUDA driver API in a child process."""

    def probe(self, target: ProbeTarget, timeout_s: float) -> ProbeResult:
        """Run the CUDA probe on ``target`` with ``CUDA_VISIBLE_DEVICES`` naming only it."""
        if target.cuda_uuid is None:
            return unprobed_result(target)
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
            return unprobed_result(target)
        try:
            behaviour = self._sim.probe_behaviour(target.cuda_uuid)
        except KeyError:
            # As real CUDA answers for a UUID that names nothing (e.g. a MIG device destroyed since).
            return ProbeResult(False, f"probe failed: CUDA sees no device for {target.cuda_uuid}",
                               "ProbeFailed", 0.0)
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
        return run_probe_process(["--uuid", target.cuda_uuid, "--simulate", behaviour], env, timeout_s)


def prober_for(nvml: object) -> Prober:
    """The right prober for an NVML handle: simulated when it can report probe behaviour."""
    if hasattr(nvml, "probe_behaviour"):
        return SimulatedProber(nvml)  # type: ignore[arg-type]
    return CudaProber()
