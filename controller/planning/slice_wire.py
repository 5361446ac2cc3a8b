"""ResourceSlices straight from the API server's bytes into what planning keeps (issue 44).

A fleet of 5,000 nodes lists about 180 MB of slice JSON. Turned into dicts by ``json`` first and
then into :class:`~controller.planning.published_slice.PublishedSlice` records, that took 4 s to
decode and 8 s to parse on one core: most of a controller's start. This module decodes a list
page with ``msgspec`` into typed records that keep the parts planning parses as the raw bytes the
server sent (:class:`msgspec.Raw`: a view, no objects made), and everything it skips
(managed fields, owner references) is never built at all.

What a device's bytes mean is then looked up by the bytes: every H200 of a fleet sends the same
capacity, counter costs and kind attributes, and the same few index, minor or PCI values, so each
distinct value is parsed once, by :mod:`controller.planning.parse` itself, and shared
(:class:`~controller.planning.interning.Interner`). Only the UUIDs are new on each device.

One source of truth: this is a fast path for well-formed slices only. Anything it does not
recognise (an unexpected type, an attribute kind it does not know, a device bound to another
node, a value :mod:`~controller.planning.parse` rejects) sends that slice through
:func:`~controller.planning.published_slice.compact_slice` on its decoded JSON, which keeps it
exactly as before, errors naming the field included. ``tests/controller/planning/test_slice_wire.py``
checks that both paths keep the same thing.

Pure: no I/O.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from sys import intern
from typing import Any

import msgspec

from controller.planning.device_view import DeviceView, Taint
from controller.planning.interning import SENT_LIMIT, AttributeMap, Interner, is_identity
from controller.planning.parse import _attribute, _capacity, _demands, parse_counter_sets, qualify
from controller.planning.published_slice import PublishedSlice, compact_slice

_NULL = msgspec.Raw(b"null")


class _Fallback(Exception):
    """This slice needs the dict path (something the fast path does not handle)."""


class _Meta(msgspec.Struct, frozen=True, gc=False):
    name: str = ""
    uid: str = ""
    resourceVersion: str = ""


class _Pool(msgspec.Struct, frozen=True, gc=False):
    name: str = ""
    generation: int = 0
    resourceSliceCount: int = 1


class _Value(msgspec.Struct, frozen=True, forbid_unknown_fields=True, gc=False):
    """One attribute value as sent (``{"string": "gpu"}``): hashable, so equal values find each other."""

    i: int | None = msgspec.field(default=None, name="int")
    b: bool | None = msgspec.field(default=None, name="bool")
    s: str | None = msgspec.field(default=None, name="string")
    v: str | None = msgspec.field(default=None, name="version")
    ints: tuple[int, ...] | None = None
    bools: tuple[bool, ...] | None = None
    strings: tuple[str, ...] | None = None
    versions: tuple[str, ...] | None = None

    def as_json(self) -> dict[str, Any]:
        """The value as the dict path reads it (its parser names what is wrong with it)."""
        return {name: value for name, value in (("int", self.i), ("bool", self.b), ("string", self.s),
                                                ("version", self.v), ("ints", self.ints), ("bools", self.bools),
                                                ("strings", self.strings), ("versions", self.versions))
                if value is not None}


class _Device(msgspec.Struct, frozen=True, gc=False):
    name: str = ""
    attributes: dict[str, _Value] = {}
    capacity: msgspec.Raw = _NULL
    consumesCounters: msgspec.Raw = _NULL
    taints: msgspec.Raw = _NULL
    allowMultipleAllocations: bool = False
    bindingConditions: msgspec.Raw = _NULL
    bindingFailureConditions: msgspec.Raw = _NULL
    # Where a device names its own node (or all nodes) the dict path decides: rare, and not worth a copy.
    nodeName: msgspec.Raw = _NULL
    allNodes: msgspec.Raw = _NULL
    nodeSelector: msgspec.Raw = _NULL


class _Spec(msgspec.Struct, frozen=True, gc=False):
    driver: str = ""
    pool: _Pool = _Pool()
    nodeName: str | None = None
    sharedCounters: msgspec.Raw = _NULL
    devices: list[_Device] = []


class _Slice(msgspec.Struct, frozen=True, gc=False):
    metadata: _Meta = _Meta()
    spec: _Spec = _Spec()


class _ListMeta(msgspec.Struct, frozen=True, gc=False):
    resourceVersion: str = ""
    continue_: str = msgspec.field(default="", name="continue")


class _Page(msgspec.Struct, frozen=True, gc=False):
    metadata: _ListMeta = _ListMeta()
    items: list[msgspec.Raw] = []


_PAGE = msgspec.json.Decoder(_Page)
_SLICE = msgspec.json.Decoder(_Slice)


def decode_slice_page(data: bytes, keep: Callable[[msgspec.Raw], PublishedSlice]) -> dict[str, Any]:
    """A ResourceSlice list answer (one page) as the informer reads a list: ``metadata``
    (``resourceVersion``, ``continue``) and ``items``, each a :class:`PublishedSlice` made by ``keep``
    (:func:`compact_slice_bytes` with its owner's interner) from the slice's bytes as the informer
    reaches it. Only the page's frame is decoded here: its items are parsed as they are read, so a
    reader may fetch the next page meanwhile (the informer does).

    An answer that is not a list of this shape is decoded as plain JSON, items as dicts (the
    informer's usual input), so nothing is lost to an unexpected answer."""
    try:
        page = _PAGE.decode(data)
    except msgspec.DecodeError:
        decoded: dict[str, Any] = json.loads(data)
        return decoded
    return {"metadata": {"resourceVersion": page.metadata.resourceVersion, "continue": page.metadata.continue_},
            "items": (keep(item) for item in page.items)}


# Between two items of a ResourceSlice list as the API server writes it: each item opens with its
# metadata. The sequence cannot occur inside a string (a quote there is escaped), and no object
# within a ResourceSlice opens with a "metadata" key, so it is always an item boundary.
_NEXT_ITEM = b'},{"metadata":'
_ITEMS = b'"items":['


def decode_slice_stream(chunks: Iterator[bytes], keep: Callable[[bytes | msgspec.Raw], PublishedSlice]
                        ) -> dict[str, Any]:
    """A ResourceSlice list answer read as it arrives (``chunks``): ``metadata`` at once, then
    ``items``, each slice handed to ``keep`` (:func:`compact_slice_bytes`) as soon as its bytes are
    in, so the answer (180 MB at 5,000 nodes) is parsed while the rest of it is still on its way and
    is never held whole. An answer laid out otherwise (items that open with their ``apiVersion``, or
    ``metadata`` after them) is read whole and decoded as a page: slower, never wrong."""
    pending = iter(chunks)
    head = bytearray()
    at = -1
    for chunk in pending:
        head += chunk
        at = head.find(_ITEMS)
        if at >= 0:
            break
    if at >= 0:
        frame = json.loads(bytes(head[:at]) + b'"items":[]}')
        metadata = frame.get("metadata") if isinstance(frame, dict) else None
        if isinstance(metadata, dict) and metadata.get("resourceVersion"):
            return {"metadata": metadata, "items": _streamed_items(head[at + len(_ITEMS):], pending, keep)}
    for chunk in pending:  # the metadata comes later, or there are no items: the answer whole
        head += chunk
    return decode_slice_page(bytes(head), keep)


def _streamed_items(buf: bytearray, pending: Iterator[bytes], keep: Callable[[bytes | msgspec.Raw], PublishedSlice]
                    ) -> Iterator[PublishedSlice]:
    start = searched = 0
    while True:
        cut = buf.find(_NEXT_ITEM, searched)
        if cut >= 0:
            yield keep(bytes(buf[start:cut + 1]))
            start = searched = cut + 2  # the next item opens with '{"metadata":'
            continue
        chunk = next(pending, None)
        if chunk is None:
            break
        del buf[:start]  # what is kept already: the buffer holds about one chunk
        searched = max(0, len(buf) - len(_NEXT_ITEM))
        start = 0
        buf += chunk
    # The last item, and whatever closes the answer: decoded as the rest of a list.
    for raw in _PAGE.decode(b'{"items":[' + bytes(buf[start:])).items:
        yield keep(raw)


def compact_slice_bytes(data: bytes | msgspec.Raw, interner: Interner) -> PublishedSlice:
    """One slice's JSON bytes (or a list page's view of them) into what planning keeps: the same
    record as :func:`~controller.planning.published_slice.compact_slice` of the decoded JSON."""
    try:
        return _fast(_SLICE.decode(data), interner)
    except (msgspec.DecodeError, _Fallback, ValueError, TypeError, KeyError, AttributeError):
        return compact_slice(json.loads(bytes(data)), interner)


def _decoded(raw: msgspec.Raw) -> Any:
    return json.loads(bytes(raw))


def _fast(s: _Slice, share: Interner) -> PublishedSlice:
    spec, pool = s.spec, s.spec.pool
    name = share.string(s.metadata.name)
    driver, pool_name = spec.driver, pool.name
    node = spec.nodeName or None
    if not (driver and pool_name):
        raise _Fallback("no driver or pool: the dict path says so")
    driver_s, pool_s = share.string(driver), share.string(pool_name)
    node_s = share.string(node) if node else None
    tables = _Tables(share, driver_s)
    # Every node of a kind shares the same counter sets (by name and amount): parsed once, and the
    # same dict handed to each of its slices (read only, like everything a PublishedSlice holds).
    sent = bytes(spec.sharedCounters)
    counters = tables.counter_sets.get(sent)
    if counters is None:
        counters = tables.put(tables.counter_sets, sent, parse_counter_sets(
            json.loads(sent) or [], f"ResourceSlice {name}", share))
    devices = tuple(_device(d, pool_s, node_s, name, tables) for d in spec.devices)
    return PublishedSlice(
        name=name, uid=s.metadata.uid, resource_version=s.metadata.resourceVersion, driver=driver_s,
        pool=pool_s, generation=pool.generation, slice_count=pool.resourceSliceCount, node=node_s,
        counters=counters, devices=devices)


class _Tables:
    """One driver's lookup tables (the interner keeps them between slices): what was sent -> parsed."""

    __slots__ = ("capacity", "counter_sets", "demands", "driver", "kinds", "names", "share", "values")

    def __init__(self, share: Interner, driver: str) -> None:
        self.share, self.driver = share, driver
        self.capacity = share.sent("capacity", driver)  # capacity bytes -> (capacity, request policies)
        self.demands = share.sent("counters")  # consumesCounters bytes -> counter demands
        self.names = share.sent("names", driver)  # attribute names -> own names as sent, qualified
        self.kinds = share.sent("kinds", driver)  # kind attributes -> the shared dict
        self.values = share.sent("values")  # one own attribute value -> parsed
        self.counter_sets = share.sent("counter-sets")  # sharedCounters bytes -> {set: {counter: amount}}

    @staticmethod
    def put(table: dict[Any, Any], key: Any, value: Any) -> Any:
        if len(table) >= SENT_LIMIT:
            table.clear()  # a fleet holds ~50,000 distinct UUIDs: past this, start afresh
        table[key] = value
        return value


def _device(d: _Device, pool: str, node: str | None, slice_name: str, t: _Tables) -> DeviceView:
    if not d.name or d.nodeName is not _NULL or d.allNodes is not _NULL or d.nodeSelector is not _NULL:
        raise _Fallback("a nameless device, or one placed on its own: the dict path decides")
    driver, share = t.driver, t.share
    sent = bytes(d.capacity)
    found = t.capacity.get(sent)
    if found is None:
        found = t.put(t.capacity, sent, _capacity({"capacity": json.loads(sent)}, driver, _WHERE, share))
    capacity, policies = found
    sent = bytes(d.consumesCounters)
    demands = t.demands.get(sent)
    if demands is None:
        demands = t.put(t.demands, sent, _demands({"consumesCounters": json.loads(sent)}, _WHERE, share))
    attributes = d.attributes  # decoded for this device alone: ours to take apart
    keys = tuple(attributes)
    found = t.names.get(keys)
    if found is None:
        found = t.put(t.names, keys, _identity_names(attributes, driver, share))
    own, names = found
    values = []
    for k in own:
        value = attributes.pop(k)
        parsed = t.values.get(value)
        if parsed is None:
            parsed = t.put(t.values, value, _own_value(value))
        values.append(parsed)
    kind = (keys, *attributes.values())  # the names as sent (order included), then the kind's values
    shared = t.kinds.get(kind)
    if shared is None:
        shared = t.put(t.kinds, kind, share.attribute_kind(
            {qualify(k, driver): _attribute(v.as_json(), _WHERE) for k, v in attributes.items()}))
    return DeviceView(  # in field order, not by keyword: 171,000 of these at 5,000 nodes
        driver, pool, intern(d.name), node, AttributeMap(shared, names, tuple(values)), capacity,
        d.allowMultipleAllocations, policies, demands,
        () if d.taints is _NULL else _taints(d.taints, share),
        () if d.bindingConditions is _NULL else _strings(d.bindingConditions, share),
        () if d.bindingFailureConditions is _NULL else _strings(d.bindingFailureConditions, share),
        slice_name,
    )


_WHERE = "ResourceSlice spec.devices[]"  # reaches no message: an error sends the slice to the dict path


def _identity_names(attributes: dict[str, _Value], driver: str, share: Interner) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The names (as sent, and fully qualified) of the attributes that identify one device, in order."""
    own = tuple(k for k in attributes if is_identity(qualify(k, driver)))
    return own, tuple(share.string(qualify(k, driver)) for k in own)


def _own_value(value: _Value) -> Any:
    parsed = _attribute(value.as_json(), _WHERE)
    return Interner.string(parsed) if isinstance(parsed, str) else parsed


def _taints(raw: msgspec.Raw, share: Interner) -> Any:
    return share.value(tuple(
        Taint(key=str(t.get("key", "")), value=str(t.get("value", "") or ""), effect=str(t.get("effect", "")))
        for t in _decoded(raw) or []))


def _strings(raw: msgspec.Raw, share: Interner) -> Any:
    return share.value(tuple(str(c) for c in _decoded(raw) or ()))
