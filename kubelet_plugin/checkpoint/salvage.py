"""Getting every record that can be trusted out of a checkpoint file that cannot.

A checkpoint fails as a whole (torn or truncated write, wrong version, checksum mismatch, a record
of the wrong shape), but the records in it are independent: dropping them all would let another
claim be prepared on a GPU a running pod still holds, and would leak MIG instances. So the file is
read record by record:

- valid JSON: every entry of ``claims`` is parsed on its own; a bad one is dropped with why;
- invalid JSON (a truncated or torn write): the ``claims`` object is scanned entry by entry with a
  JSON decoder until the first entry that does not decode, so everything before the damage is kept.

No I/O; the caller quarantines the file and reports :attr:`Salvage.summary`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

T = TypeVar("T")
_DECODER = json.JSONDecoder()
_BOOT_ID = re.compile(r'"bootId"\s*:\s*"([^"\\]*)"')
_CLAIMS = re.compile(r'"claims"\s*:\s*\{')


@dataclass
class Salvage(Generic[T]):
    """What could be read from a corrupt checkpoint."""

    boot_id: str | None = None
    records: dict[str, T] = field(default_factory=dict)
    dropped: list[tuple[str, str]] = field(default_factory=list)  # (uid or "?", why)
    truncated: bool = False  # the scan stopped at damage: records after it, if any, are lost

    @property
    def summary(self) -> str:
        """One line for logs and the Event: what was kept and what was dropped, with why."""
        kept = len(self.records)
        parts = [f"salvaged {kept} record{'s' if kept != 1 else ''}"
                 + (f" ({', '.join(sorted(self.records))})" if 0 < kept <= 8 else "")]
        if self.dropped:
            shown = "; ".join(f"{uid}: {why}" for uid, why in self.dropped[:5])
            more = f"; and {len(self.dropped) - 5} more" if len(self.dropped) > 5 else ""
            parts.append(f"dropped {len(self.dropped)} ({shown}{more})")
        if self.truncated:
            parts.append("the file is damaged past that point, so later records are lost")
        return ", ".join(parts)


def salvage(data: bytes, parse: Callable[[Any, str], T]) -> Salvage[T]:
    """Every record of ``data`` that ``parse(raw record, uid)`` accepts (it raises on a bad one)."""
    result: Salvage[T] = Salvage()
    try:
        raw = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        text = data.decode("utf-8", errors="replace")
        entries = _scan(text, result)
        match = _BOOT_ID.search(text)
        result.boot_id = match.group(1) if match else None
    else:
        if not isinstance(raw, dict):
            result.dropped.append(("?", "the file is not a JSON object"))
            return result
        boot = raw.get("bootId")
        result.boot_id = boot if isinstance(boot, str) else None
        claims = raw.get("claims")
        if not isinstance(claims, dict):
            if claims not in (None, [], {}):
                result.dropped.append(("?", f"claims is a {type(claims).__name__}, not an object"))
            return result
        entries = list(claims.items())
    for uid, record in entries:
        try:
            result.records[uid] = parse(record, uid)
        except Exception as exc:  # each bad record is reported, the others still count
            result.dropped.append((uid, str(exc) or type(exc).__name__))
    return result


def _scan(text: str, result: Salvage[Any]) -> list[tuple[str, Any]]:
    """The ``"uid": {...}`` entries of the claims object, up to the first that does not decode."""
    match = _CLAIMS.search(text)
    if match is None:
        result.truncated = bool(text.strip())
        return []
    entries: list[tuple[str, Any]] = []
    pos = match.end()
    while True:
        pos = _skip_ws(text, pos)
        if pos < len(text) and text[pos] == "}":
            return entries
        try:
            key, pos = _DECODER.raw_decode(text, pos)
            pos = _skip_ws(text, pos)
            if text[pos] != ":":
                raise ValueError("no ':'")
            value, pos = _DECODER.raw_decode(text, _skip_ws(text, pos + 1))
        except (ValueError, IndexError):
            result.truncated = True
            return entries
        if isinstance(key, str):
            entries.append((key, value))
        pos = _skip_ws(text, pos)
        if pos < len(text) and text[pos] == ",":
            pos += 1
        elif pos >= len(text) or text[pos] != "}":
            result.truncated = True
            return entries


def _skip_ws(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in " \t\r\n":
        pos += 1
    return pos
