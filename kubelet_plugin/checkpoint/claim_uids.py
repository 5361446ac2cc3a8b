"""What a claim UID may look like when it names files, locks and checkpoint records.

The kubelet's DRA proto (``string uid = 2; // ResourceClaim metadata.uid``) gives
no length or alphabet. Kubernetes generates RFC 4122 UUIDs (36 characters); we accept any string
of ASCII letters, digits and ``-`` up to :data:`UID_MAX` characters, which covers every UID the API
server mints and keeps a UID safe as a path component (no ``/``, ``..`` or NUL) and bounded in size.
"""

from __future__ import annotations

import re

UID_MAX = 128
_UID = re.compile(r"^[0-9A-Za-z-]+$")


def uid_problem(uid: object) -> str | None:
    """Why ``uid`` cannot be a ResourceClaim UID, or None when it can (the message names no field)."""
    if not isinstance(uid, str):
        return f"is a {type(uid).__name__}, not a string"
    if not uid:
        return "is empty"
    if len(uid) > UID_MAX:
        return (f"is {len(uid)} characters long; a ResourceClaim UID (an RFC 4122 UUID, 36 characters) "
                f"has at most {UID_MAX}")
    if not _UID.match(uid):
        shown = uid if len(uid) <= 64 else uid[:64] + "..."
        return (f"{shown!r} has characters other than letters, digits and '-'; a ResourceClaim UID is an "
                "RFC 4122 UUID such as 627b3f5b-3aba-492f-8a3c-8f1c5e0b2d11")
    return None
