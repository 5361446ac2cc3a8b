"""A fault channel into a simulated NVML that runs in another process (a real plugin process).

The e2e tests run ``python -m dra_driver kubelet-plugin --nvml sim:...`` as a process of its own, so
they cannot call ``sim.faults`` directly. When the environment names a directory in
:data:`CONTROL_DIR_ENV`, :func:`~testbed.nvml_sim.open_simulated` starts a :class:`ControlChannel`
on it: a daemon thread that polls the directory for fault files and applies each one through the
same :class:`~testbed.nvml_sim.sim_faults.SimFaults` methods the in-process tests call, so a fault
looks to the plugin exactly as it does there (an XID event, ``GpuIsLost`` from calls, ...).

A fault file is ``<anything>.json`` holding ``{"fault": "<SimFaults method>", "args": {...}}``,
e.g. ``{"fault": "inject_xid", "args": {"gpu_index": 0, "xid": 79}}``, or ``{"faults": [...]}`` of
several such, applied together (:meth:`~testbed.nvml_sim.sim_faults.SimFaults.together`,
:func:`send_faults`). Files are applied in name order (:func:`send_fault` names them by a counter and
time, so in the order sent), each exactly once: the channel renames it to ``<name>.done``, or writes
the error to ``<name>.error`` and removes it. :func:`send_fault` writes a file atomically and, by
default, waits for that answer.

Only the public fault methods of :class:`SimFaults` can be named (:data:`FAULTS`), plus one fault of
the plugin process rather than of its GPUs: ``pause_at`` with ``{"point": "after:write_cdi_spec",
"marker": "<name>"}`` arms :func:`testbed.crash_points.pause_at`, so the plugin stops dead the next
time it reaches that point of a prepare or unprepare (a step of
:data:`kubelet_plugin.prepare.steps.STEPS`) and writes its PID to that file in this directory (a test
then kills it there, in a plugin process or in the chart's pod alike); ``pause_after_cdi_write`` with
``{"marker": "<name>"}`` is ``pause_at`` ``after:write_cdi_spec``. Anything else is an ``.error``, never an arbitrary call.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import threading
import time
from typing import TYPE_CHECKING, Any, Protocol

from dra_driver.logs import get_logger
from testbed.nvml_sim.sim_faults import SimFaults

if TYPE_CHECKING:
    from testbed.nvml_sim.node_profiles import NodeProfile

log = get_logger(__name__)

CONTROL_DIR_ENV = "GPUREADY_SIM_CONTROL_DIR"
POLL_S = 0.05
FAULTS = frozenset({"inject_xid", "ecc_double_bit", "gpu_lost", "fall_off_bus", "return_to_bus",
                    "unknown_error", "row_remap_pending", "probe", "nvml_init_fails", "clear",
                    "driver_unload", "driver_load", "driver_reload"})
PROCESS_FAULTS = frozenset({"pause_after_cdi_write", "pause_at"})

_sent = itertools.count(1)


class FaultTarget(Protocol):
    """What the channel uses of a simulated NVML (a :class:`~testbed.nvml_sim.SimulatedNvml`).

    Declared here because the package imports this module to open the channel: naming
    SimulatedNvml back would tie the two into a cycle.
    """

    @property
    def faults(self) -> SimFaults:
        """The fault injection API the fault files name methods of."""
        ...

    @property
    def profile(self) -> NodeProfile:
        """The node profile (its name goes into the channel's log events)."""
        ...


class FaultFileError(ValueError):
    """A fault file the channel cannot apply (bad JSON, unknown fault, bad arguments)."""


def _check(fault: Any, args: Any, path: str) -> dict[str, Any]:
    if not isinstance(fault, str) or fault not in FAULTS | PROCESS_FAULTS:
        raise FaultFileError(f"{path}: unknown fault {fault!r}; one of {', '.join(sorted(FAULTS | PROCESS_FAULTS))}")
    if not isinstance(args, dict):
        raise FaultFileError(f"{path}: args must be an object, got {args!r}")
    if fault == "unknown_error" and args.get("functions") is not None:
        args = {**args, "functions": set(args["functions"])}
    return args


def apply_fault_file(sim: FaultTarget, path: str) -> str:
    """Apply one fault file to ``sim``; return a one-line description (raise FaultFileError if bad).

    ``{"faults": [{"fault": ..., "args": ...}, ...]}`` applies several at once (``SimFaults.together``,
    the simulator's lock): nothing in the plugin sees the GPU between them (XID 79 and the GPU lost
    are one event).
    """
    try:
        with open(path) as f:
            body = json.load(f)
    except (OSError, ValueError) as e:
        raise FaultFileError(f"{path}: not a JSON fault file: {e}") from e
    if not isinstance(body, dict):
        raise FaultFileError(f"{path}: want {{\"fault\": <name>, \"args\": {{...}}}}, got {body!r}")
    steps = body["faults"] if isinstance(body.get("faults"), list) else [body]
    checked: list[tuple[str, dict[str, Any]]] = []
    for step in steps:
        if not isinstance(step, dict):
            raise FaultFileError(f"{path}: each fault must be an object, got {step!r}")
        checked.append((str(step.get("fault")), _check(step.get("fault"), step.get("args") or {}, path)))
    done = []
    for fault, args in [(f, a) for f, a in checked if f in PROCESS_FAULTS]:
        _arm_crash_point(os.path.dirname(path), fault, args, path)
        done.append(f"{fault}({', '.join(f'{k}={v}' for k, v in sorted(args.items()))})")
    checked = [(f, a) for f, a in checked if f not in PROCESS_FAULTS]
    with sim.faults.together():
        for fault, args in checked:
            try:
                getattr(sim.faults, fault)(**args)
            except (TypeError, ValueError, IndexError) as e:
                raise FaultFileError(f"{path}: {fault}({args}) failed: {e}") from e
            done.append(f"{fault}({', '.join(f'{k}={v}' for k, v in sorted(args.items()))})")
    return "; ".join(done)


def _arm_crash_point(directory: str, fault: str, args: dict[str, Any], path: str) -> None:
    marker = args.get("marker")
    point = args.get("point", "after:write_cdi_spec")
    keys = {"marker", "point"} if fault == "pause_at" else {"marker"}
    if set(args) != keys or not isinstance(marker, str) or not marker or os.path.basename(marker) != marker \
            or not isinstance(point, str):
        form = '{"point": "before:<step>", "marker": <file name>}' if fault == "pause_at" else '{"marker": <file name>}'
        raise FaultFileError(f"{path}: {fault} takes {form}, got {args!r}")
    from testbed.crash_points import pause_at  # the plugin process's own code, wrapped

    try:
        pause_at(point, os.path.join(directory, marker))
    except ValueError as exc:
        raise FaultFileError(f"{path}: {fault}: {exc}") from exc


class ControlChannel:
    """Polls ``directory`` for fault files and applies them to ``sim`` (see the module docstring)."""

    def __init__(self, sim: FaultTarget, directory: str, poll_s: float = POLL_S) -> None:
        """Create the directory if needed; nothing is polled until :meth:`start`."""
        self.sim = sim
        self.directory = directory
        self.poll_s = poll_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sim-control", daemon=True)
        os.makedirs(directory, exist_ok=True)

    def start(self) -> ControlChannel:
        """Start the polling thread (a daemon: it dies with the process)."""
        self._thread.start()
        log.info("sim_control_started", directory=self.directory, profile=self.sim.profile.name)
        return self

    def stop(self) -> None:
        """Stop polling (the in-process tests; a plugin process just exits)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)

    def poll_once(self) -> int:
        """Apply every pending fault file once, in name order; return how many were handled."""
        try:
            names = sorted(n for n in os.listdir(self.directory) if n.endswith(".json"))
        except FileNotFoundError:
            return 0
        for name in names:
            path = os.path.join(self.directory, name)
            if not os.path.exists(path):  # listed, then gone: not ours to apply
                continue
            try:
                what = apply_fault_file(self.sim, path)
            except FaultFileError as e:
                log.warning("sim_fault_rejected", file=name, error=str(e))
                with open(path + ".error", "w") as f:
                    f.write(str(e))
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
                continue
            os.replace(path, path + ".done")
            log.info("sim_fault_applied", file=name, fault=what, profile=self.sim.profile.name)
        return len(names)

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                self.poll_once()
            except Exception as e:  # a broken file system must not kill the plugin it runs in
                log.error("sim_control_failed", directory=self.directory, error=str(e))


def start_from_env(sim: FaultTarget) -> ControlChannel | None:
    """A started :class:`ControlChannel` on ``$GPUREADY_SIM_CONTROL_DIR``, or None when it is unset."""
    directory = os.environ.get(CONTROL_DIR_ENV, "")
    return ControlChannel(sim, directory).start() if directory else None


def send_fault(directory: str, fault: str, wait_s: float | None = 10.0, **args: Any) -> str:
    """Ask the simulated NVML polling ``directory`` to apply ``fault(**args)``; return the file's path
    (see :func:`send_faults`)."""
    return send_faults(directory, [(fault, args)], wait_s)


def send_faults(directory: str, faults: list[tuple[str, dict[str, Any]]], wait_s: float | None = 10.0) -> str:
    """Ask the simulated NVML polling ``directory`` to apply ``faults`` (name, args) together, in
    order, with nothing seeing the GPU in between; return the file's path.

    The file is written under a temporary name and renamed into place, so the channel never reads
    half of it. With ``wait_s`` (the default), wait until the channel answered: return on ``.done``,
    raise FaultFileError with its message on ``.error`` and TimeoutError when nothing answers.
    """
    os.makedirs(directory, exist_ok=True)
    label = "+".join(f for f, _ in faults)
    name = f"{time.time_ns():020d}-{next(_sent):04d}-{label}.json"
    path = os.path.join(directory, name)
    tmp = os.path.join(directory, "." + name + ".tmp")
    with open(tmp, "w") as f:
        json.dump({"faults": [{"fault": f, "args": a} for f, a in faults]}, f)
    os.replace(tmp, path)
    if wait_s is None:
        return path
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if os.path.exists(path + ".done"):
            return path
        if os.path.exists(path + ".error"):
            with open(path + ".error") as f:
                raise FaultFileError(f.read())
        time.sleep(0.02)
    raise TimeoutError(f"no simulated NVML applied {path} within {wait_s:.0f}s "
                       f"(is {CONTROL_DIR_ENV}={directory} set in its process?)")
