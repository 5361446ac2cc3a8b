"""A protobuf wire encoder that knows nothing about descriptors: just the wire format rules.

The wire tests (tests/proto/) build their expected bytes with it, never with the generated code, so a
wrong field number, type, package or name in a .proto file fails them. The names are short because
the tests nest them: ``m(1, s(1, "ns") + v(2, 1))`` is message field 1 holding string field 1 and
varint field 2.
"""

from __future__ import annotations

VARINT, LEN = 0, 2  # wire types


def varint(value: int) -> bytes:
    """Base-128 varint; negative int64 values are sign-extended to 64 bits (10 bytes)."""
    if value < 0:
        value += 1 << 64
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def tag(field: int, wire_type: int) -> bytes:
    """The key that precedes every field on the wire (field_number << 3 | wire_type)."""
    return varint(field << 3 | wire_type)


def s(field: int, text: str) -> bytes:
    """A string field."""
    data = text.encode()
    return tag(field, LEN) + varint(len(data)) + data


def m(field: int, payload: bytes) -> bytes:
    """An embedded message field (``payload``: the message's own bytes)."""
    return tag(field, LEN) + varint(len(payload)) + payload


def v(field: int, value: int) -> bytes:
    """A varint field (bool, enum, int64, uint64)."""
    return tag(field, VARINT) + varint(value)


def packed(field: int, values: list[int]) -> bytes:
    """A repeated scalar field; proto3 packs it: one LEN field holding the varints."""
    return m(field, b"".join(varint(x) for x in values))
