"""The host's dynamic loader cache (``/etc/ld.so.cache``), read the way ``ld.so`` reads it.

The driver's libraries are wherever the host's loader finds them: ``/usr/lib/x86_64-linux-gnu`` on
Ubuntu, ``/usr/lib64`` on RHEL, ``/usr/local/nvidia/lib64`` on GKE (listed in ``ld.so.conf.d``).
Reading the cache finds them in all of these without a list of guessed directories.

Format (glibc's ``cache_file_new``, "glibc-ld.so.cache1.1"; written alone by glibc >= 2.32, after
the old "ld.so-1.7.0" table by older ldconfig): a 48-byte header (magic and version, 20 bytes;
``nlibs``; ``len_strings``; flags and padding; extension offset; 3 unused words), then ``nlibs``
entries of 24 bytes (``int32 flags``, ``uint32 key``, ``uint32 value``, ``uint32 osversion``,
``uint64 hwcap``) whose key (the SONAME) and value (the path) are offsets from the header's start.
Pure: :func:`parse_ld_cache` works on bytes.
"""

from __future__ import annotations

import platform
import struct
from dataclasses import dataclass

OLD_MAGIC = b"ld.so-1.7.0"
NEW_MAGIC = b"glibc-ld.so.cache1.1"
_NEW_HEADER = 48
_NEW_ENTRY = 24
_OLD_HEADER = 16  # 11-byte magic, padding, uint32 nlibs
_OLD_ENTRY = 12
# The entry's flags: the library type in the low byte (3 = ELF for glibc 2+), the ABI in the next.
FLAG_ELF_LIBC6 = 0x0003
_ABI_FLAGS = {"x86_64": 0x0300, "aarch64": 0x0A00}


@dataclass(frozen=True)
class CacheEntry:
    """One library the loader knows: its SONAME and the path it loads it from."""

    soname: str
    path: str
    flags: int


def _cstring(data: bytes, offset: int) -> str:
    end = data.find(b"\0", offset)
    return data[offset:end if end >= 0 else len(data)].decode("utf-8", errors="replace")


def parse_ld_cache(data: bytes) -> list[CacheEntry]:
    """Every entry of an ``ld.so.cache`` in the file's order (the loader's preference order).

    Returns [] for an empty file, the old format alone, or a truncated one: the caller then looks in
    the driver's usual directories instead.
    """
    start = 0
    if data.startswith(OLD_MAGIC):
        if len(data) < _OLD_HEADER:
            return []
        old_count, = struct.unpack_from("<I", data, 12)
        start = _OLD_HEADER + old_count * _OLD_ENTRY
        start = (start + 7) & ~7  # the new table is 8-byte aligned after the old one
    if data[start:start + len(NEW_MAGIC)] != NEW_MAGIC or len(data) < start + _NEW_HEADER:
        return []
    count, = struct.unpack_from("<I", data, start + 20)
    entries = []
    for i in range(count):
        at = start + _NEW_HEADER + i * _NEW_ENTRY
        if at + _NEW_ENTRY > len(data):
            break
        flags, key, value = struct.unpack_from("<iII", data, at)
        if start + key >= len(data) or start + value >= len(data):
            continue
        entries.append(CacheEntry(_cstring(data, start + key), _cstring(data, start + value), flags))
    return entries


def native_entries(entries: list[CacheEntry], machine: str | None = None) -> list[CacheEntry]:
    """The entries this machine's loader would use: glibc ELF libraries of its own ABI (a 32-bit
    ``libcuda.so.1`` in the same cache is skipped)."""
    abi = _ABI_FLAGS.get(machine or platform.machine())
    wanted = FLAG_ELF_LIBC6 | abi if abi is not None else None
    return [e for e in entries if (e.flags & 0xFFFF) == wanted] if wanted is not None else \
        [e for e in entries if (e.flags & 0xFF) == FLAG_ELF_LIBC6]
