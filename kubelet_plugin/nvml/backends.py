"""Where ``--nvml`` finds its NVML: the real library, or a backend registered under a name.

``--nvml real`` is the ``pynvml`` module. ``--nvml <name>:<argument>`` (``sim:4xh200@node-a``) asks
the backend registered as ``<name>``: one registered in this process with :func:`register_backend`,
or else one advertised by an installed distribution under the entry-point group
:data:`ENTRY_POINT_GROUP`. The simulated NVML of the testbed reaches the plugin only through this
seam (gpuready's own ``pyproject.toml`` advertises it as ``sim``), so no production module imports a
stand-in, and a node image that leaves the testbed out simply has no ``sim`` backend.
"""

from __future__ import annotations

import importlib
import os
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

ENTRY_POINT_GROUP = "gpuready.nvml_backends"


@dataclass(frozen=True)
class NvmlBackend:
    """A named NVML source: ``open(argument)`` returns an uninitialised object with pynvml's surface.

    ``choices()`` lists the arguments it accepts (profile names), for help texts and error messages;
    ``simulated`` says its GPUs have no device nodes or CUDA (the daemon skips those checks).
    """

    name: str
    open: Callable[[str], Any]
    choices: Callable[[], list[str]]
    simulated: bool = True


_lock = threading.Lock()
_registered: dict[str, NvmlBackend] = {}


def register_backend(backend: NvmlBackend) -> None:
    """Make ``backend`` answer ``--nvml <backend.name>:...`` in this process (tests, the demo)."""
    with _lock:
        _registered[backend.name] = backend


def _advertised() -> dict[str, str]:
    """Every entry point of the group: name -> ``module:attribute`` (importlib.metadata's full scan)."""
    from importlib.metadata import entry_points

    return {ep.name: ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)}


def _declared(name: str) -> str | None:
    """``module:attribute`` of the entry point ``name`` of the group, read straight from the installed
    distributions' ``entry_points.txt`` on ``sys.path`` (first found wins, as for imports); None when
    no such file names it.

    Why not importlib.metadata: a plugin started on a simulated node paid 8 ms of start-up before its
    first ResourceSlice and 1.5 MB of resident memory for that module and its scan of every
    distribution's metadata, to read one line. Anything this reader does not find (a zipped egg, a
    custom finder) still goes through importlib.metadata.
    """
    header = f"[{ENTRY_POINT_GROUP}]"
    for entry in sys.path:
        try:
            names = [n for n in os.listdir(entry or ".") if n.endswith((".dist-info", ".egg-info"))]
        except OSError:
            continue
        for dist in names:
            try:
                with open(os.path.join(entry or ".", dist, "entry_points.txt"), encoding="utf-8") as f:
                    lines = f.read().splitlines()
            except OSError:
                continue
            section = ""
            for line in lines:
                line = line.strip()
                if line.startswith("["):
                    section = line
                elif section == header and "=" in line:
                    key, _, value = line.partition("=")
                    if key.strip() == name:
                        return value.split("[", 1)[0].strip()  # an entry point may name extras: [a, b]
    return None


def _load(value: str) -> Any:
    """The object an entry point value ``module:attribute`` names."""
    module, _, attribute = value.partition(":")
    found: Any = importlib.import_module(module.strip())
    for part in attribute.strip().split("."):
        if part:
            found = getattr(found, part)
    return found


def find_backend(name: str) -> NvmlBackend | None:
    """The backend called ``name``: registered here first, else an installed entry point."""
    with _lock:
        found = _registered.get(name)
    if found is not None:
        return found
    value = _declared(name) or _advertised().get(name)
    if value is None:
        return None
    try:
        factory = _load(value)
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.split(".")[0] == value.split(".")[0].split(":")[0]:
            return None  # advertised, but its package is not installed (the production image)
        raise
    backend = factory() if callable(factory) and not isinstance(factory, NvmlBackend) else factory
    if not isinstance(backend, NvmlBackend):
        raise ValueError(f"entry point {value!r} ({ENTRY_POINT_GROUP}) gave {backend!r}, not an NvmlBackend")
    register_backend(backend)
    return backend


def backend_names() -> list[str]:
    """Every backend name this process could use, sorted."""
    with _lock:
        names = set(_registered)
    return sorted(names | set(_advertised()))


def describe_sources() -> str:
    """``real``, then each backend with its choices: for help texts and the error of a bad ``--nvml``."""
    parts = ["real"]
    for name in backend_names():
        try:
            backend = find_backend(name)
            if backend is None:
                continue
            choices = backend.choices()
        except Exception as exc:  # a broken extension must not break the help text
            parts.append(f"{name}:<...> (unavailable: {exc})")
            continue
        parts.append(f"{name}:<{'|'.join(choices) or 'argument'}>")
    return ", ".join(parts)
