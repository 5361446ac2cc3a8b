"""What an ELF file is, read from its bytes: whether it is ELF at all, and a shared library's SONAME.

The driver's files are mounted into containers by the name the loader looks for (the SONAME,
``libcuda.so.1``), and only real ELF files are mounted: a host whose ``/usr/bin/nvidia-smi`` is a
wrapper script (GKE's layout, where the driver lives under ``/usr/local/nvidia``) must not hand
that script to a container, where it fails. Pure functions over bytes; :func:`read_head` is the
only I/O.
"""

from __future__ import annotations

import struct
from collections.abc import Callable

ELF_MAGIC = b"\x7fELF"
_PT_LOAD, _PT_DYNAMIC = 1, 2
_DT_NULL, _DT_STRTAB, _DT_SONAME = 0, 5, 14
# Enough for the headers and the dynamic section of the driver's libraries; the string table is
# read on demand through ``read_at``.
HEAD_BYTES = 4096


def is_elf(head: bytes) -> bool:
    """Whether ``head`` (the first bytes of a file) starts an ELF file."""
    return head[:4] == ELF_MAGIC


def read_head(path: str, size: int = HEAD_BYTES) -> bytes:
    """The first ``size`` bytes of ``path`` (fewer for a shorter file)."""
    with open(path, "rb") as f:
        return f.read(size)


def elf_soname(path: str) -> str | None:
    """The DT_SONAME of the 64-bit little-endian ELF shared object at ``path``, or None when it is
    not one or names none. Raises ``OSError`` when the file cannot be read."""
    with open(path, "rb") as f:
        def read_at(offset: int, size: int) -> bytes:
            f.seek(offset)
            return f.read(size)

        return soname_from(read_at)


def soname_from(reader: Callable[[int, int], bytes]) -> str | None:
    """The SONAME found through ``reader(offset, size) -> bytes`` (a file or a buffer), or None."""
    ident = reader(0, 64)
    if len(ident) < 64 or not is_elf(ident) or ident[4] != 2 or ident[5] != 1:  # ELFCLASS64, little-endian
        return None
    phoff, = struct.unpack_from("<Q", ident, 32)
    phentsize, phnum = struct.unpack_from("<HH", ident, 54)
    table = reader(phoff, phentsize * phnum)
    loads: list[tuple[int, int, int]] = []  # (vaddr, file offset, file size)
    dynamic: tuple[int, int] | None = None
    for i in range(phnum):
        if len(table) < (i + 1) * phentsize:
            return None
        p_type, _flags, p_offset, p_vaddr, _paddr, p_filesz = struct.unpack_from("<IIQQQQ", table, i * phentsize)
        if p_type == _PT_LOAD:
            loads.append((p_vaddr, p_offset, p_filesz))
        elif p_type == _PT_DYNAMIC:
            dynamic = (p_offset, p_filesz)
    if dynamic is None:
        return None
    entries = reader(dynamic[0], dynamic[1])
    strtab = soname = None
    for i in range(len(entries) // 16):
        tag, value = struct.unpack_from("<qQ", entries, i * 16)
        if tag == _DT_NULL:
            break
        if tag == _DT_STRTAB:
            strtab = value
        elif tag == _DT_SONAME:
            soname = value
    if strtab is None or soname is None:
        return None
    offset = _file_offset(loads, strtab)
    if offset is None:
        return None
    raw = reader(offset + soname, 256)
    name = raw.split(b"\0", 1)[0]
    return name.decode("ascii", errors="replace") or None


def _file_offset(loads: list[tuple[int, int, int]], vaddr: int) -> int | None:
    """The file offset of virtual address ``vaddr`` through the PT_LOAD segments, or None."""
    for seg_vaddr, seg_offset, seg_size in loads:
        if seg_vaddr <= vaddr < seg_vaddr + seg_size:
            return seg_offset + (vaddr - seg_vaddr)
    return None
