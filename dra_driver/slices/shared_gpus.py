"""Shared GPUs (consumable capacity, Kubernetes 1.36+): the share modes, their request policies and
the name check. Pure.

Share modes (the admin picks one per node, and may override it per GPU; NVIDIA's driver calls them
``--consumable-shares``, with the same published form):

- ``memory`` (gpuready's VRAM-consumable GPUs): claims consume ``memory``, by default all of it;
- ``unlimited``: any number of claims share the GPU; a claim consumes no ``memory`` unless it asks
  (``default`` 0, ``min`` 0, ``step`` 1Mi, ``max`` the memory rounded down to 1Mi);
- ``<N>`` (a positive integer): the GPU carries a ``shares`` capacity of N; a claim consumes one
  share unless it asks for more (``default`` 1, ``min`` 1, ``max`` N, ``step`` 1) and ``memory``
  as in ``unlimited``, so at most N claims share it.

The scheduler does the counting; what a claim gets at prepare (a share of the GPU with no runtime
isolation, like NVIDIA's) is the kubelet plugin's business.

Request policy. A request that does not name a consumable capacity consumes the policy's
``default`` (the DeviceCapacity requestPolicy of resource.k8s.io/v1, consumable capacity; the kube-scheduler and the planner both do this). The
``gpu.nvidia.com`` DeviceClass matches shared GPUs too, so a plain "one GPU" claim must take the
whole GPU there, not a sliver: the default is the GPU's full memory, rounded down to the step so
the API server accepts it (upstream validation: ``min <= default``, ``default - min`` a multiple
of ``step``, ``min + step <= value``). What rounding leaves over is less than one step, so with
``step <= min`` (the 1 GiB / 1 GiB default) no other claim fits beside a default-sized one. Claims
that state ``capacity.requests.memory`` (the ``vram.gpu.nvidia.com`` class and its shaping) still
pack by what they ask.

Name check. ``--shared-gpus`` names GPUs by their published name (``gpu-<minor>``). A name that
matches no GPU shares nothing; :func:`check_shared_gpu_names` says which entries those are, what
the valid names are, and which entry was probably meant, so the plugin can log it once at start.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from dra_driver.devices import Gpu, MigMode, NodeDevices

from .model import Capacity, RequestPolicy

MIB = 1024**2
SHARE_MODES = ("memory", "unlimited")  # or a positive integer: a `shares` capacity of that many
MAX_SHARES = 1_000_000


def parse_share_mode(text: str, where: str = "--share-mode") -> str:
    """``memory``, ``unlimited`` or a positive integer (as text); ValueError naming ``where`` and the fix."""
    value = text.strip()
    if value in SHARE_MODES:
        return value
    if value.isdigit() and 1 <= int(value) <= MAX_SHARES:
        return str(int(value))
    raise ValueError(f"{where} {text!r}: use memory, unlimited, or a number of shares from 1 to {MAX_SHARES}")


def _unlimited_memory_policy(memory_bytes: int) -> RequestPolicy:
    """``memory`` that claims consume only when they ask: default 0, in whole MiB up to the GPU's."""
    ceiling = memory_bytes // MIB * MIB
    return RequestPolicy(default=0, min=0, step=MIB if memory_bytes >= MIB else None, max=ceiling)


def shared_capacity(memory_bytes: int, mode: str, min_bytes: int, step_bytes: int
                    ) -> tuple[tuple[str, Capacity], ...]:
    """The capacity a shared whole GPU publishes in ``mode`` (see the module's docstring)."""
    if mode == "memory":
        return (("memory", Capacity(memory_bytes, binary=True,
                                    request_policy=shared_memory_policy(memory_bytes, min_bytes, step_bytes))),)
    memory = ("memory", Capacity(memory_bytes, binary=True, request_policy=_unlimited_memory_policy(memory_bytes)))
    if mode == "unlimited":
        return (memory,)
    count = int(parse_share_mode(mode))
    # A step that does not fit once above min is rejected upstream ("one step is larger than the
    # capacity value"): one share has none.
    shares = RequestPolicy(default=1, min=1, step=1 if count >= 2 else None, max=count)
    return (memory, ("shares", Capacity(count, request_policy=shares)))


def shared_memory_policy(memory_bytes: int, min_bytes: int, step_bytes: int) -> RequestPolicy:
    """The ``memory`` request policy of a shared GPU with ``memory_bytes`` of VRAM.

    ``min`` is ``min_bytes`` (at most the whole GPU); ``default`` is the largest ``min + n * step``
    that fits in the GPU (the full memory, rounded down to the step). A step that would not fit
    once above ``min`` (a GPU smaller than ``min + step``, rejected upstream as "one step is larger
    than capacity value") is left out, and the default is then the exact memory.
    """
    if memory_bytes <= 0 or min_bytes <= 0 or step_bytes <= 0:
        raise ValueError(f"memory_bytes={memory_bytes}, min_bytes={min_bytes}, step_bytes={step_bytes}: "
                         "all must be positive byte counts")
    minimum = min(min_bytes, memory_bytes)
    if minimum + step_bytes > memory_bytes:
        return RequestPolicy(default=memory_bytes, min=minimum)
    default = minimum + (memory_bytes - minimum) // step_bytes * step_bytes
    return RequestPolicy(default=default, min=minimum, step=step_bytes)


@dataclass(frozen=True)
class SharedGpuNames:
    """What ``--shared-gpus`` names, against the GPUs discovered on the node.

    ``unknown``: entries that match no GPU (nothing is shared for them); ``suggestions`` maps such
    an entry to the name it most likely meant (``gpu0`` -> ``gpu-0``, a UUID -> its name);
    ``valid``: every GPU name the option accepts on this node; ``mig_static``: named GPUs whose MIG
    mode is on, published as their MIG devices in static MIG mode and so not shared.
    """

    unknown: tuple[str, ...] = ()
    valid: tuple[str, ...] = ()
    suggestions: tuple[tuple[str, str], ...] = ()
    mig_static: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        """Every entry names a GPU that is published shared."""
        return not self.unknown and not self.mig_static

    def message(self) -> str:
        """One sentence for the log: the bad entries, the valid names and the fix."""
        parts: list[str] = []
        if self.unknown:
            hints = dict(self.suggestions)
            named = ", ".join(f"{u!r} (did you mean {hints[u]!r}?)" if u in hints else repr(u)
                              for u in self.unknown)
            valid = ", ".join(self.valid) or "none: no GPU was discovered"
            parts.append(f"--shared-gpus (env SHARED_GPUS) names {named}, which match no GPU discovered on "
                         "this node, so they are not shared (a GPU off the bus at start is shared once it is "
                         f"back); valid names here: {valid} (or 'all'). Fix the flag or the SHARED_GPUS "
                         "environment variable (Helm value sharedGpus)")
        if self.mig_static:
            parts.append(f"--shared-gpus names {', '.join(self.mig_static)}, whose MIG mode is on: in static MIG "
                         "mode they are published as their MIG devices, not shared")
        return "; ".join(parts)


def _normal(text: str) -> str:
    return re.sub(r"[^a-z0-9]", "", text.lower())


def _suggest(entry: str, gpus: tuple[Gpu, ...]) -> str | None:
    for gpu in gpus:
        if entry.lower() == gpu.uuid.lower():
            return gpu.name
    norm = _normal(entry)
    for gpu in gpus:
        if norm in (_normal(gpu.name), str(gpu.minor)):
            return gpu.name
    return None


def check_shared_gpu_names(shared_gpus: frozenset[str] | bool, devices: NodeDevices,
                           mig_mode: str = "static") -> SharedGpuNames:
    """Check a ``--shared-gpus`` list against the node's GPUs (``True``/``False`` are always fine)."""
    gpus = tuple(sorted(devices.gpus, key=lambda g: g.minor))
    valid = tuple(g.name for g in gpus)
    if isinstance(shared_gpus, bool):
        return SharedGpuNames(valid=valid)
    unknown = tuple(sorted(n for n in shared_gpus if n not in valid))
    suggestions = tuple((u, s) for u in unknown if (s := _suggest(u, gpus)) is not None)
    mig_static = tuple(g.name for g in gpus if g.name in shared_gpus and mig_mode == "static"
                       and g.mig_mode == MigMode.ENABLED)
    return SharedGpuNames(unknown=unknown, valid=valid, suggestions=suggestions, mig_static=mig_static)
