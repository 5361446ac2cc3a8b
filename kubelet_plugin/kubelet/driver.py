"""The seam between the kubelet side and the GPU driver: what the kubelet side asks, and what it gets back.

The kubelet side (this package) serves the kubelet's gRPC, fetches each claim and publishes the
node's slices; the driver behind it (:class:`kubelet_plugin.prepare.preparer.Preparer`) only says what
preparing and unpreparing a claim's devices does. For each claim of a NodePrepareResources call the
kubelet side checks the reference (:func:`uid_problem`), asks :meth:`DraDriver.recorded` (a repeated
prepare is answered without reading the claim), else reads the claim and calls
:meth:`DraDriver.prepare` with it; NodeUnprepareResources calls :meth:`DraDriver.unprepare`. Errors
are per claim (:class:`ClaimOutcome`), never a failed call.

What a claim UID may look like (it names files, locks and checkpoint records): the kubelet's DRA
proto (``string uid = 2; // ResourceClaim metadata.uid``) gives no length or alphabet. Kubernetes
generates RFC 4122 UUIDs (36 characters); we accept any string of ASCII letters, digits and ``-``
up to :data:`UID_MAX` characters, which covers every UID the API server mints and keeps a UID safe
as a path component (no ``/``, ``..`` or NUL) and bounded in size.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Protocol

UID_MAX = 128
UID_RE = re.compile(r"^[0-9A-Za-z-]+$")


@dataclass(frozen=True)
class ClaimRef:
    """One claim of a NodePrepareResources or NodeUnprepareResources request, checked."""

    uid: str
    namespace: str
    name: str


@dataclass
class PreparedDevice:
    """One device of the answer given to the kubelet (NodePrepareResourceResponse.devices[]); the
    checkpoint keeps it so a repeated prepare gets the same answer."""

    request_names: list[str]
    pool_name: str
    device_name: str
    cdi_device_ids: list[str]
    share_id: str | None = None
    extra: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)  # unknown keys, kept


@dataclass(frozen=True)
class ClaimOutcome:
    """The result of preparing or unpreparing one claim: an answer or an error message."""

    devices: tuple[PreparedDevice, ...] = ()
    error: str = ""
    reason: str = ""  # a short word for the gpuready_prepare_errors_total label


class PrepareError(Exception):
    """A claim cannot be prepared; ``reason`` is a short word for metrics, the message is for people."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class ClaimSource(Protocol):
    """The kubelet side's claim reads, handed to the driver: it reads a claim only when it has no
    recorded answer for it (a repeated prepare reads nothing)."""

    def read(self, ref: ClaimRef) -> dict[str, Any]:
        """The claim as the API server has it; raises :class:`PrepareError` (its own reason) when it
        cannot be read or is gone."""


class DraDriver(Protocol):
    """What the GPU driver does for the kubelet side; each call never raises (errors are outcomes)."""

    @property
    def pool(self) -> str:
        """This node's pool (the node name), for the kubelet side's log lines."""

    def prepare(self, ref: ClaimRef, claims: ClaimSource) -> ClaimOutcome:
        """Prepare the devices ``ref``'s claim allocates on this node: the recorded answer of a prepare
        already completed, else the claim read from ``claims`` and prepared."""

    def unprepare(self, ref: ClaimRef) -> ClaimOutcome:
        """Undo what preparing ``ref`` did; succeeds for a claim never prepared."""

    def prepared_count(self) -> int:
        """How many claims are prepared now (a gauge)."""


def uid_problem(uid: object) -> str | None:
    """Why ``uid`` cannot be a ResourceClaim UID, or None when it can (the message names no field)."""
    if not isinstance(uid, str):
        return f"is a {type(uid).__name__}, not a string"
    if not uid:
        return "is empty"
    if len(uid) > UID_MAX:
        return (f"is {len(uid)} characters long; a ResourceClaim UID (an RFC 4122 UUID, 36 characters) "
                f"has at most {UID_MAX}")
    if not UID_RE.match(uid):
        shown = uid if len(uid) <= 64 else uid[:64] + "..."
        return (f"{shown!r} has characters other than letters, digits and '-'; a ResourceClaim UID is an "
                "RFC 4122 UUID such as 627b3f5b-3aba-492f-8a3c-8f1c5e0b2d11")
    return None
