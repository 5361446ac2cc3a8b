"""The checkpoint file's bytes: layout, version, checksum (pure: bytes in, records out).

Layout, version 1 (the current one)::

    {"version": 1, "bootId": "<boot id>", "checksum": "sha256:<hex>", "claims": {"<uid>": {...}}}

``checksum`` covers the canonical JSON (sorted keys, no spaces) of everything else, so a torn or
hand-edited file is detected; ``bootId`` tells records of an earlier boot apart. Top-level keys this
version does not know are kept and written back (a newer plugin's, during a rolling update).

Versions. :data:`DECODERS` maps every version this plugin reads to its decoder; :func:`encode`
writes :data:`CURRENT_VERSION`. A file of a version with no decoder (a newer plugin's, after a
downgrade) is refused as :class:`CheckpointCorrupt` with ``newer=True``: the store moves it aside
untouched, never overwrites it. The path to a version 2 (tests/kubelet_plugin/checkpoint/
test_checkpoint_versions.py walks it with the fixtures in tests/fixtures/checkpoint/):

1. Release N+1 adds ``decode_v2`` to :data:`DECODERS` and keeps ``decode_v1``, but still *writes*
   version 1. During a rolling update the old and new plugin share the file, so nobody may write a
   version the other cannot read.
2. Release N+2 (once N is no longer supported) sets :data:`CURRENT_VERSION` to 2. A version 1 file
   is decoded by ``decode_v1`` into the same records and written back as version 2 at the next
   update; nothing is migrated in place.
3. Removing ``decode_v1`` comes last, once no supported release writes version 1.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from typing import Any

from kubelet_plugin.checkpoint.salvage import Salvage, salvage
from kubelet_plugin.checkpoint.schema import ClaimRecord, RecordError

CURRENT_VERSION = 1
CHECKPOINT_VERSION = CURRENT_VERSION  # the version this plugin writes

Decoded = tuple[str, dict[str, ClaimRecord], dict[str, Any]]  # boot ID, records, unknown top-level keys
Decoder = Callable[[dict[str, Any], bytes], Decoded]


class CheckpointCorrupt(Exception):
    """The checkpoint file cannot be trusted (unreadable, bad checksum, unknown version, a bad record).

    ``salvage`` holds what could still be read from it, record by record.
    """

    def __init__(self, message: str, salvaged: Salvage[ClaimRecord] | None = None, newer: bool = False) -> None:
        super().__init__(message)
        self.salvage: Salvage[ClaimRecord] = salvaged if salvaged is not None else Salvage()
        self.newer = newer  # written by a newer plugin in a version this one cannot read


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def _checksum(canonical_body: str) -> str:
    return "sha256:" + hashlib.sha256(canonical_body.encode()).hexdigest()


def encode(boot_id: str, claims: dict[str, ClaimRecord],
           cache: dict[str, tuple[ClaimRecord, str]] | None = None,
           extra: dict[str, Any] | None = None) -> bytes:
    """Serialise a checkpoint with its checksum.

    The checksum covers the canonical JSON (sorted keys, no spaces) of everything but itself.
    ``cache`` (uid -> (record, its canonical JSON)) lets a writer re-encode only records that
    changed: records are replaced, never mutated, so identity tells whether one changed. ``extra``:
    top-level keys a newer plugin wrote, carried through.
    """
    parts = []
    for uid in sorted(claims):
        record = claims[uid]
        cached = cache.get(uid) if cache is not None else None
        if cached is not None and cached[0] is record:
            text = cached[1]
        else:
            text = _canonical(record.to_json())
            if cache is not None:
                cache[uid] = (record, text)
        parts.append(f"{json.dumps(uid)}:{text}")
    if cache is not None:
        for stale in set(cache) - set(claims):
            del cache[stale]
    if extra:
        known = {"bootId": boot_id, "claims": {uid: claims[uid].to_json() for uid in claims},
                 "version": CHECKPOINT_VERSION}
        body = _canonical({**{k: v for k, v in extra.items() if k != "checksum"}, **known})
    else:
        # Byte-identical to _canonical({"bootId", "claims", "version"}): keys in sorted order.
        body = f'{{"bootId":{json.dumps(boot_id)},"claims":{{{",".join(parts)}}},"version":{CHECKPOINT_VERSION}}}'
    return f'{{"checksum":"{_checksum(body)}",{body[1:]}'.encode()


def _parse_record(raw: Any, uid: str) -> ClaimRecord:
    return ClaimRecord.from_json(raw, uid)


def decode_v1(raw: dict[str, Any], data: bytes) -> Decoded:
    """Version 1: checksum over the rest, ``bootId`` string, ``claims`` object of records by UID."""
    def corrupt(why: str) -> CheckpointCorrupt:
        return CheckpointCorrupt(why, salvage(data, _parse_record))

    body = {k: v for k, v in raw.items() if k != "checksum"}
    if raw.get("checksum") != _checksum(_canonical(body)):
        raise corrupt("checksum mismatch (torn write or edited file)")
    if not isinstance(raw.get("bootId"), str) or not isinstance(raw.get("claims"), dict):
        raise corrupt("bootId must be a string and claims an object")
    found: Salvage[ClaimRecord] = Salvage(boot_id=raw["bootId"])  # parsed once, record by record
    for uid, rec in raw["claims"].items():
        try:
            found.records[uid] = _parse_record(rec, uid)
        except RecordError as exc:
            found.dropped.append((uid, str(exc)))
    if found.dropped:
        shown = "; ".join(f"{uid}: {why}" for uid, why in found.dropped[:3])
        raise CheckpointCorrupt(f"{len(found.dropped)} malformed record(s): {shown}", found)
    extra = {k: v for k, v in body.items() if k not in ("bootId", "claims", "version")}
    return raw["bootId"], found.records, extra


# Every version this plugin reads. See the module docstring for how a version 2 is added.
DECODERS: Mapping[int, Decoder] = {1: decode_v1}


def decode_full(data: bytes, decoders: Mapping[int, Decoder] = DECODERS) -> Decoded:
    """Parse and verify a checkpoint of any version in ``decoders``; (boot ID, records, unknown keys).

    Raises :class:`CheckpointCorrupt` with what could be salvaged when anything is wrong, with
    ``newer=True`` for a version newer than every decoder (a newer plugin's file).
    """
    try:
        raw = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise CheckpointCorrupt(f"not valid JSON: {exc}", salvage(data, _parse_record)) from exc
    if not isinstance(raw, dict):
        raise CheckpointCorrupt("not a JSON object", salvage(data, _parse_record))
    version = raw.get("version")
    decoder = decoders.get(version) if isinstance(version, int) and not isinstance(version, bool) else None
    if decoder is None:
        known = ", ".join(str(v) for v in sorted(decoders))
        newer = isinstance(version, int) and not isinstance(version, bool) and version > max(decoders)
        why = (f"version {version} was written by a newer gpuready; this plugin reads version(s) {known}: "
               "upgrade the plugin again, or remove the file once no claim is prepared on this node"
               if newer else f"version {version!r} is not a checkpoint version (this plugin reads {known})")
        raise CheckpointCorrupt(why, salvage(data, _parse_record), newer=newer)
    return decoder(raw, data)


def decode(data: bytes) -> tuple[str, dict[str, ClaimRecord]]:
    """Parse and verify a checkpoint; return (boot ID, records). Raises :class:`CheckpointCorrupt`."""
    boot_id, records, _ = decode_full(data)
    return boot_id, records


