"""The inventory: every usable published device, and what allocated claims already consume.

Built from raw Kubernetes JSON (ResourceSlices, ResourceClaims, DeviceClasses) exactly the way the
scheduler reads them: per pool only the slices of the highest generation, and only complete pools
(as many slices as ``resourceSliceCount`` says). Allocated claims take devices (except
multi-allocatable ones, whose capacity they consume instead) and consume shared counters.

Indexes for planning at scale: devices are grouped into *shapes* (same driver, same attributes
apart from per-device identity such as UUID/index/PCI address, same capacity, taints and counter
costs), and for each shape the devices free now are kept per node. A selector that does not read
identity attributes is evaluated once per shape, not once per device.

Pure: what the build leaves out (an incomplete pool, a slice that does not parse, a nameless
class, an unreadable consumed capacity) is returned in :attr:`Inventory.skipped` for the caller to
log or show, never logged here.
"""

from __future__ import annotations

import gc
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, cast

from controller.planning.device_view import Amount, DeviceKey, DeviceView
from controller.planning.interning import IDENTITY_ATTRIBUTES, AttributeMap
from controller.planning.parse import SpecError, claim_ref, quantity_field
from controller.planning.published_slice import PublishedSlice, SliceCache
from controller.planning.taint_rules import with_rule_taints

__all__ = ["IDENTITY_ATTRIBUTES", "Inventory", "SliceCache", "build_inventory"]
_DISTINCT_LIMIT = 64  # an attribute with more distinct values than this is treated as identity too

CounterSetKey = tuple[str, str, str]
"""``(driver, pool, counter set name)``."""


@dataclass(frozen=True)
class ClaimUse:
    """One allocated claim's use of one device."""

    claim: str  # namespace/name
    claim_uid: str
    request: str
    admin_access: bool
    share_id: str | None
    consumed: dict[str, Fraction]


@dataclass(frozen=True)
class Skipped:
    """Something a build left out of the inventory, and why (the owner logs or shows it)."""

    kind: str  # "pool", "slice", "class" or "claim"
    name: str  # driver/pool, slice name, class name ("" when it has none), or claim namespace/name
    reason: str  # the whole message, naming the field and the fix
    node: str | None = None  # the node the slice or pool publishes for
    uid: str | None = None  # the claim's UID (kind "claim")


@dataclass(frozen=True)
class DeviceClassView:
    """A DeviceClass: its selectors and its opaque config."""

    name: str
    selectors: tuple[str, ...]
    config: tuple[dict[str, Any], ...]


@dataclass
class Shape:
    """Devices that look alike to any selector that ignores identity attributes."""

    index: int
    representative: DeviceView
    devices: list[DeviceView] = field(default_factory=list)
    by_node: dict[str | None, list[DeviceView]] = field(default_factory=dict)  # free or not

    @property
    def memory(self) -> Fraction:
        """The memory capacity every device of this shape has."""
        return self.representative.memory


@dataclass
class Inventory:
    """All usable devices and their current use. Read-only for the planner."""

    devices: dict[DeviceKey, DeviceView]
    classes: dict[str, DeviceClassView]
    counter_totals: dict[CounterSetKey, dict[str, Amount]]
    counter_used: dict[CounterSetKey, dict[str, Amount]]
    counter_users: dict[CounterSetKey, list[tuple[DeviceKey, str]]]  # (device, claim) holding counters
    uses: dict[DeviceKey, list[ClaimUse]]  # every allocation, admin ones included
    taken_by: dict[DeviceKey, str]  # exclusive (non-admin, not shareable) device -> claim
    capacity_used: dict[DeviceKey, dict[str, Fraction]]  # shareable devices
    node_used: dict[str, Fraction]  # memory allocated per node
    parent_used: dict[str, Fraction]  # memory allocated per physical GPU
    shapes: list[Shape]
    free: list[dict[str | None, list[DeviceView]]]  # per shape: node -> devices free now
    identity_attributes: frozenset[str]
    nodes: list[str]
    problems: list[str] = field(default_factory=list)  # slices/claims skipped, and why (the reasons of skipped)
    skipped: list[Skipped] = field(default_factory=list)  # the same, typed: what was left out
    incomplete_pools: list[str] = field(default_factory=list)
    node_used_bytes: dict[str, int] = field(default_factory=dict)  # node_used in whole bytes, for scoring
    pool_devices: dict[tuple[str, str], list[DeviceView]] = field(default_factory=dict)
    # Pools the scheduler treats as invalid (a device name listed twice): "driver/pool" -> node.
    invalid_pools: dict[str, str | None] = field(default_factory=dict)
    accounted: set[str] = field(default_factory=set)  # claims (by UID) whose allocation is counted

    def device(self, key: DeviceKey) -> DeviceView | None:
        """A device by ``(driver, pool, name)``."""
        return self.devices.get(key)

    def add_claim(self, claim: dict[str, Any]) -> None:
        """Account a claim that was just allocated, in place (cheaper than a rebuild: one pool).

        Not thread-safe: the owner updates its inventory under its own lock, or builds a new one.
        """
        _refresh(self, _account_claim(self, claim))

    def remove_claim(self, claim: dict[str, Any]) -> None:
        """Undo :meth:`add_claim` for a claim that was deallocated or deleted (pass its last state)."""
        _refresh(self, _account_claim(self, claim, sign=-1))

    def parent_key(self, device: DeviceView) -> str:
        """The physical GPU a device lives on (MIG devices share their parent's)."""
        return parent_key(device)

    def counters_fit(self, device: DeviceView, extra: dict[CounterSetKey, dict[str, Amount]] | None = None) -> bool:
        """Whether the device's counter costs fit in what is left (plus ``extra`` already planned)."""
        for demand in device.consumes_counters:
            ckey = (device.driver, device.pool, demand.counter_set)
            total = self.counter_totals.get(ckey)
            if total is None:
                return False
            used = self.counter_used.get(ckey, {})
            if extra and ckey in extra:
                planned = extra[ckey]
                for cname, amount in demand.counters:
                    if used.get(cname, 0) + planned.get(cname, 0) + amount > total.get(cname, -1):
                        return False
                continue
            for cname, amount in demand.counters:
                if used.get(cname, 0) + amount > total.get(cname, -1):
                    return False
        return True


def parent_key(device: DeviceView) -> str:
    """``parentUUID`` or ``uuid`` of the device (driver domain), else its own ID."""
    for name in ("parentUUID", "uuid"):
        value = device.attributes.get(f"{device.driver}/{name}")
        if isinstance(value, str) and value:
            return value
    return device.id


def _complete_pools(slices: list[PublishedSlice], skipped: list[Skipped], incomplete: list[str]) -> list[PublishedSlice]:
    pools: dict[tuple[str, str], list[PublishedSlice]] = defaultdict(list)
    for s in slices:
        if not s.driver or not s.pool:
            skipped.append(Skipped("slice", s.name, f"ResourceSlice {s.name}: spec.driver and spec.pool.name are required",
                                   node=s.node))
            continue
        pools[(s.driver, s.pool)].append(s)
    usable: list[PublishedSlice] = []
    for (driver, pool_name), members in sorted(pools.items()):
        top = max(m.generation for m in members)
        current = [m for m in members if m.generation == top]
        expected = max(m.slice_count for m in current)
        if len(current) < expected:
            incomplete.append(f"{driver}/{pool_name}")
            nodes = {m.node for m in current}
            skipped.append(Skipped("pool", f"{driver}/{pool_name}", (
                f"pool {driver}/{pool_name} generation {top} has {len(current)} of {expected} slices: "
                "skipped until it is complete (as the scheduler does)"),
                node=nodes.pop() if len(nodes) == 1 else None))
            continue
        usable.extend(sorted(current, key=lambda m: m.name))
    return usable


def build_inventory(
    slices: Sequence[dict[str, Any] | PublishedSlice], claims: list[dict[str, Any]],
    device_classes: list[dict[str, Any]], cache: SliceCache | None = None,
    taint_rules: list[dict[str, Any]] | None = None,
) -> Inventory:
    """Build the inventory from API objects: dicts as the API server returns them, or slices already
    compacted as they arrived (:func:`controller.planning.published_slice.compact_slice`).

    ``taint_rules`` are DeviceTaintRule objects: their taint applies to the devices their
    ``spec.deviceSelector`` (driver, pool, device; unset = any) names, as if the slice carried it.

    ``cache`` (a :class:`SliceCache` kept by the caller) makes rebuilds from JSON after small changes
    cheap; without one, each JSON slice is parsed for this build only.
    """
    # A build allocates hundreds of thousands of acyclic objects; the cyclic collector would run
    # repeatedly over the growing heap for nothing (measured: 2-3x slower at 150k devices). It is
    # paused for the build only and restored even on error.
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return _build(slices, claims, device_classes, cache, taint_rules or [])
    finally:
        if was_enabled:
            gc.enable()


def _compacted(slices: Sequence[dict[str, Any] | PublishedSlice], cache: SliceCache | None) -> list[PublishedSlice]:
    seen: set[tuple[str, str]] = set()
    owner = cache if cache is not None else SliceCache()
    out = [s if isinstance(s, PublishedSlice) else owner.parsed(s, seen) for s in slices]
    if cache is not None:
        cache.forget_unseen(seen)
    return out


def _build(slices: Sequence[dict[str, Any] | PublishedSlice], claims: list[dict[str, Any]],
           device_classes: list[dict[str, Any]], cache: SliceCache | None, taint_rules: list[dict[str, Any]]) -> Inventory:
    skipped: list[Skipped] = []
    incomplete: list[str] = []
    devices: dict[DeviceKey, DeviceView] = {}
    counter_totals: dict[CounterSetKey, dict[str, Amount]] = {}
    duplicated: dict[tuple[str, str], tuple[str, str | None]] = {}  # pool -> (device name, node)
    order = 0
    for s in _complete_pools(_compacted(slices, cache), skipped, incomplete):
        if s.error:
            skipped.append(Skipped("slice", s.name, s.error, node=s.node))
            continue
        for set_name, amounts in s.counters.items():
            counter_totals[(s.driver, s.pool, set_name)] = amounts
        for parsed in s.devices:
            # A copy per build: the inventory writes its order and shape into it, and the parsed
            # view is shared by every build (and read by the inventory the webhook holds now).
            dev = parsed.fresh_copy()
            dev.order = order
            order += 1
            if taint_rules:
                dev = with_rule_taints(dev, taint_rules)
            key = (dev.driver, dev.pool, dev.name)
            if key in devices:
                duplicated.setdefault((s.driver, s.pool), (dev.name, s.node))
            devices.setdefault(key, dev)
    invalid = _drop_invalid_pools(devices, counter_totals, duplicated, skipped)

    inv = Inventory(
        devices=devices,
        classes=_classes(device_classes, skipped),
        counter_totals=counter_totals,
        counter_used=defaultdict(dict),
        counter_users=defaultdict(list),
        uses=defaultdict(list),
        taken_by={},
        capacity_used=defaultdict(dict),
        node_used=defaultdict(Fraction),
        parent_used=defaultdict(Fraction),
        shapes=[],
        free=[],
        identity_attributes=_identity_attributes(devices.values()),
        nodes=sorted({d.node for d in devices.values() if d.node}),
        problems=[s.reason for s in skipped],
        skipped=skipped,
        incomplete_pools=incomplete,
        invalid_pools=invalid,
    )
    for claim in claims:
        _account_claim(inv, claim)
    _build_shapes(inv)
    inv.node_used_bytes = {n: int(v) for n, v in inv.node_used.items()}
    return inv


def _drop_invalid_pools(devices: dict[DeviceKey, DeviceView], counter_totals: dict[CounterSetKey, dict[str, Amount]],
                        duplicated: dict[tuple[str, str], tuple[str, str | None]],
                        skipped: list[Skipped]) -> dict[str, str | None]:
    """Remove pools that list a device name twice: the scheduler uses none of their devices."""
    invalid: dict[str, str | None] = {}
    for (driver, pool), (name, node) in sorted(duplicated.items()):
        for key in [k for k in devices if k[0] == driver and k[1] == pool]:
            del devices[key]
        for ckey in [k for k in counter_totals if k[0] == driver and k[1] == pool]:
            del counter_totals[ckey]
        invalid[f"{driver}/{pool}"] = node
        skipped.append(Skipped("pool", f"{driver}/{pool}", (
            f"pool {driver}/{pool} lists device {name!r} more than once across its ResourceSlices: the "
            "kube-scheduler treats the pool as invalid and allocates none of its devices; the driver must "
            "publish each device name once per pool"), node=node))
    return invalid


def _classes(raw: list[dict[str, Any]], skipped: list[Skipped]) -> dict[str, DeviceClassView]:
    result: dict[str, DeviceClassView] = {}
    for c in raw:
        name = (c.get("metadata") or {}).get("name")
        if not name:
            skipped.append(Skipped("class", "", "DeviceClass without metadata.name skipped"))
            continue
        spec = c.get("spec") or {}
        result[name] = DeviceClassView(
            name=name,
            selectors=tuple(str((s.get("cel") or {}).get("expression", "")) for s in spec.get("selectors") or []),
            config=tuple(spec.get("config") or ()),
        )
    return result


def _identity_attributes(devices: Any) -> frozenset[str]:
    distinct: dict[str, set[Any]] = defaultdict(set)
    walked: set[int] = set()  # shared attribute dicts and name tuples already counted (one per kind of device)
    own: set[str] = set()
    for d in devices:
        attrs = d.attributes
        if isinstance(attrs, AttributeMap):
            # Its own values are identity attributes by name: only their names (a shared tuple) matter.
            if id(attrs.own_names) not in walked:
                walked.add(id(attrs.own_names))
                own.update(attrs.own_names)
            if id(attrs.shared) in walked:
                continue
            walked.add(id(attrs.shared))
            pairs: Any = attrs.shared.items()
        else:
            pairs = attrs.items()
        for qname, value in pairs:
            values = distinct[qname]
            if len(values) <= _DISTINCT_LIMIT:
                values.add(value)
    names = {q for q in (*distinct, *own) if q.rpartition("/")[2] in IDENTITY_ATTRIBUTES}
    names |= {q for q, values in distinct.items() if len(values) > _DISTINCT_LIMIT}
    return frozenset(names)


def _results(inv: Inventory, claim: dict[str, Any]) -> list[tuple[DeviceKey, ClaimUse]]:
    allocation = (claim.get("status") or {}).get("allocation")
    if not allocation:
        return []
    ref, uid = claim_ref(claim), str((claim.get("metadata") or {}).get("uid", ""))
    out = []
    for i, r in enumerate((allocation.get("devices") or {}).get("results") or []):
        key = (str(r.get("driver", "")), str(r.get("pool", "")), str(r.get("device", "")))
        where = f"claim {ref} status.allocation.devices.results[{i}].consumedCapacity"
        try:
            consumed = {k if "/" in k else f"{key[0]}/{k}": quantity_field(v, f"{where}[{k}]")
                        for k, v in (r.get("consumedCapacity") or {}).items()}
        except SpecError as exc:
            inv.skipped.append(Skipped("claim", ref, str(exc), uid=uid or None))
            inv.problems.append(str(exc))
            consumed = {}
        out.append((key, ClaimUse(ref, uid, str(r.get("request", "")), bool(r.get("adminAccess")),
                                  r.get("shareID"), consumed)))
    return out


def _account_claim(inv: Inventory, claim: dict[str, Any], sign: int = 1) -> set[DeviceKey]:
    """Add (sign 1) or remove (sign -1) what an allocated claim holds; returns the devices touched."""
    touched: set[DeviceKey] = set()
    if (claim.get("status") or {}).get("allocation"):
        # Counted once per claim: informers replay objects, and a claim added twice must not
        # consume its capacity twice.
        meta = claim.get("metadata") or {}
        ident = str(meta.get("uid") or claim_ref(claim))
        if sign > 0:
            if ident in inv.accounted:
                return touched
            inv.accounted.add(ident)
        else:
            if ident not in inv.accounted:
                return touched
            inv.accounted.discard(ident)
    for key, use in _results(inv, claim):
        dev = inv.devices.get(key)
        uses = inv.uses[key]
        if sign > 0:
            uses.append(use)
        else:
            match = next((u for u in uses if u.claim == use.claim and u.request == use.request), None)
            if match is None:
                continue
            uses.remove(match)
            use = match
        if dev is None or use.admin_access:
            continue  # withdrawn device, or admin access (which neither takes nor consumes)
        touched.add(key)
        others = any(not u.admin_access for u in uses if u is not use)
        if dev.allow_multiple_allocations:
            used = inv.capacity_used[key]
            for cname, amount in (use.consumed or dict(dev.capacity)).items():
                used[cname] = used.get(cname, Fraction(0)) + sign * amount
            if not others and sign < 0:
                del inv.capacity_used[key]
            memory = use.consumed.get(f"{dev.driver}/memory", Fraction(0))
        else:
            if sign > 0:
                inv.taken_by[key] = use.claim
            elif inv.taken_by.get(key) == use.claim:
                del inv.taken_by[key]
            memory = dev.memory
        if not others:  # counters are paid once per device, by its first user
            for demand in dev.consumes_counters:
                ckey = (dev.driver, dev.pool, demand.counter_set)
                for cname, units in demand.counters:
                    inv.counter_used[ckey][cname] = inv.counter_used[ckey].get(cname, 0) + sign * units
                if sign > 0:
                    inv.counter_users[ckey].append((key, use.claim))
                else:
                    inv.counter_users[ckey] = [cu for cu in inv.counter_users[ckey] if cu[0] != key]
        if dev.node:
            inv.node_used[dev.node] += sign * memory
            inv.node_used_bytes[dev.node] = int(inv.node_used[dev.node])
        inv.parent_used[parent_key(dev)] += sign * memory
    return touched


def _is_free(inv: Inventory, dev: DeviceView, fits: dict[tuple[int, int], bool] | None = None) -> bool:
    if dev.key in inv.taken_by:
        return False
    # A shared device already in use has paid its counters; anything else must still fit.
    if dev.allow_multiple_allocations and dev.key in inv.capacity_used:
        return True
    if fits is None:
        return inv.counters_fit(dev)
    # A build: with nothing drawn yet from a set, whether a kind's costs fit its (interned) totals is
    # worked out once per kind (``fits``: ids of objects the build holds), not per device.
    for demand in dev.consumes_counters:
        ckey = (dev.driver, dev.pool, demand.counter_set)
        total = inv.counter_totals.get(ckey)
        if total is None or ckey in inv.counter_used:
            return inv.counters_fit(dev)
        fit = fits.get((id(demand), id(total)))
        if fit is None:
            fit = fits[(id(demand), id(total))] = all(a <= total.get(c, -1) for c, a in demand.counters)
        if not fit:
            return False
    return True


def _refresh(inv: Inventory, touched: set[DeviceKey]) -> None:
    """Recompute the free lists of every device that shares a pool with a touched device."""
    pools = {(k[0], k[1]) for k in touched}
    cells = {(d.shape, d.node) for pool in pools for d in inv.pool_devices.get(pool, ())}
    for shape_index, node in cells:
        devs = [d for d in inv.shapes[shape_index].by_node.get(node, ()) if _is_free(inv, d)]
        if devs:
            inv.free[shape_index][node] = devs
        else:
            inv.free[shape_index].pop(node, None)


def shape_signature(dev: DeviceView, identity: frozenset[str]) -> tuple[Any, ...]:
    """What a device looks like to selectors, tolerations and capacity requests, apart from which
    one it is. Counter costs are left out: they decide availability, which is tracked per device."""
    cached = dev.signature_cache
    if cached is not None and cached[0] == identity:
        return cast(tuple[Any, ...], cached[1])
    return (
        dev.driver,
        tuple(sorted((k, v) for k, v in dev.attributes.items() if k not in identity)),
        tuple(sorted(dev.capacity.items())),
        dev.allow_multiple_allocations,
        tuple(sorted(dev.request_policies.items(), key=lambda kv: kv[0])),
        dev.taints,
        dev.binding_conditions,
        dev.node is None,
    )


def _parts(dev: DeviceView) -> tuple[Any, ...] | None:
    """The objects a device's signature is computed from, by identity: devices parsed by one
    interner share them, so one signature serves every device of a kind (None: not shared)."""
    if not isinstance(dev.attributes, AttributeMap):
        return None
    return (dev.driver, id(dev.attributes.shared), dev.attributes.own_names, id(dev.capacity),
            dev.allow_multiple_allocations, id(dev.request_policies), id(dev.taints), id(dev.binding_conditions),
            dev.node is None)


def _build_shapes(inv: Inventory) -> None:
    by_signature: dict[tuple[Any, ...], Shape] = {}
    # Shapes by the shared objects a signature comes from (alive for the whole build, so their ids
    # are stable): one signature is computed and hashed per kind of device, not per device.
    by_parts: dict[tuple[Any, ...], Shape] = {}
    fits: dict[tuple[int, int], bool] = {}
    for dev in sorted(inv.devices.values(), key=lambda d: d.order):
        parts = _parts(dev)
        shape = by_parts.get(parts) if parts is not None else None
        if shape is None:
            sig = shape_signature(dev, inv.identity_attributes)
            shape = by_signature.get(sig)
            if shape is None:
                shape = Shape(len(inv.shapes), dev)
                by_signature[sig] = shape
                inv.shapes.append(shape)
                inv.free.append({})
            if parts is not None:
                by_parts[parts] = shape
        dev.shape = shape.index
        inv.pool_devices.setdefault((dev.driver, dev.pool), []).append(dev)
        shape.devices.append(dev)
        shape.by_node.setdefault(dev.node, []).append(dev)
        if _is_free(inv, dev, fits):
            inv.free[shape.index].setdefault(dev.node, []).append(dev)
