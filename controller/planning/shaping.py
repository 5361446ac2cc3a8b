"""VRAM shaping: turn "give me 15 GiB" into a best-fit prioritized list the scheduler understands.

The admission webhook calls :func:`shape_vram_request` for an ``exactly`` request of the
memory-sized DeviceClass that carries ``capacity.requests.memory``. The result replaces it with a
``firstAvailable`` list of memory tiers, smallest first: the devices up to twice the size of the
smallest shape in the cluster that fits (the best fit), then any device that fits. The kube-scheduler
scores a node by the first entry it can satisfy there, so it prefers nodes with a best-fit device
cluster-wide; on the chosen node it takes the first device of the entry in the node's list, which
the plugin orders by ascending memory (:mod:`dra_driver.ordering`): the smallest device there.

Why tiers and not one entry per shape: the scheduler evaluates an entry's CEL against every device of
every node it filters until an entry matches, so each entry that cannot match on a node costs a
scan of that node's devices. On a real kube-scheduler over 1,000 mixed GPU nodes (docs/scale.md),
one entry per shape (up to 8) made a shaped claim cost 4-6 times a plain one-GPU claim, and the 8-entry
cap left the biggest GPUs out of the list; two tiers keep the best fit a scheduler can score and cost
about what a plain claim costs. The last tier has no upper bound, so a device bigger than any the
cluster had at admission still qualifies.

Each entry keeps the user's selectors, tolerations and count, and adds one CEL selector with the
tier's memory range (floor = the request). A tier that holds shareable GPUs keeps
``capacity.requests.memory``: there it says how much of the GPU to consume (on an exclusive device it
is only a floor); a tier without them excludes shareable GPUs, so none is taken whole.

Pure: reads an :class:`~controller.planning.cluster_inventory.Inventory`, returns new dicts.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from controller.planning.alternatives import AltPlan, prepare_alternative
from controller.planning.cluster_inventory import Inventory, Shape
from controller.planning.parse import SpecError
from controller.planning.requests import parse_alternative
from dra_driver.ordering import shape_offer_key
from dra_driver.quantity import QuantityError, human_bytes, parse_quantity

GIB = 1024**3

TIERS = 2  # entries of the list: best fit, then any fit (see the module docstring for why two)
TIER_RATIO = 2  # the best-fit tier: devices up to this many times the smallest fitting shape
ORIGINAL_ANNOTATION = "gpuready.io/original-requests"
"""Claim (template) annotation: JSON map of request name -> the request as the user wrote it."""


@dataclass
class ShapingResult:
    """``request`` is what to write (the original when nothing changed); ``warning`` for the user."""

    request: dict[str, Any]
    original: dict[str, Any]
    changed: bool = False
    warning: str | None = None
    entries: list[str] = field(default_factory=list)  # "up to 39 GiB: MIG 1g.20gb (19.5 GiB)", in order

    def annotation(self, existing: str | None = None) -> str:
        """The value of :data:`ORIGINAL_ANNOTATION` with this request's original added."""
        recorded: dict[str, Any] = json.loads(existing) if existing else {}
        recorded[str(self.original.get("name", ""))] = self.original
        return json.dumps(recorded, sort_keys=True, separators=(",", ":"))


@dataclass
class _Offer:
    kind: str  # mig | shared | gpu | device
    label: str  # profile or product name
    memory: Fraction
    driver: str

    def sort_key(self) -> tuple[Any, ...]:
        return shape_offer_key(self.memory, self.kind, self.label)


def _kind(shape: Shape) -> tuple[str, str]:
    rep = shape.representative
    dtype = rep.attr("type")
    if dtype == "mig" and isinstance(rep.attr("profile"), str):
        return "mig", str(rep.attr("profile"))
    label = str(rep.attr("productName") or rep.name)
    if dtype == "gpu":
        return ("shared" if rep.allow_multiple_allocations else "gpu"), label
    return "device", label


def _offers(ap: AltPlan, inventory: Inventory) -> list[_Offer]:
    offers: dict[tuple[str, str, str], _Offer] = {}
    for shape in ap.shapes:
        if ap.per_device and not any(all(s.matches(d) for s in ap.per_device) for d in shape.devices):
            continue
        kind, label = _kind(shape)
        key = (shape.representative.driver, kind, label)
        if key not in offers or shape.memory < offers[key].memory:
            offers[key] = _Offer(kind, label, shape.memory, shape.representative.driver)
    return sorted(offers.values(), key=_Offer.sort_key)


def tiers(offers: list[_Offer], count: int = TIERS, ratio: int = TIER_RATIO) -> list[list[_Offer]]:
    """Group ``offers`` (smallest first) into at most ``count`` tiers: each tier holds the offers up to
    ``ratio`` times its smallest one's memory; the last holds every offer left."""
    groups: list[list[_Offer]] = []
    for offer in offers:
        if groups and (len(groups) == count or offer.memory <= groups[-1][0].memory * ratio):
            groups[-1].append(offer)
        else:
            groups.append([offer])
    return groups


def _tier_selector(tier: list[_Offer], wanted_text: str, last: bool, shared_exist: bool) -> str:
    """One CEL expression: memory at least the request and, but for the last tier, at most the tier's
    biggest shape; exclusive devices only where the tier holds no shareable GPU."""
    clauses = []
    for driver in sorted({o.driver for o in tier}):
        memory = f'device.capacity["{driver}"].memory'
        clause = f"{memory}.compareTo(quantity({json.dumps(wanted_text)})) >= 0"
        if not last:
            top = max(o.memory for o in tier if o.driver == driver)
            clause += f' && {memory}.compareTo(quantity("{int(top)}")) <= 0'
        if len({o.driver for o in tier}) > 1:
            clause = f'device.driver == {json.dumps(driver)} && {clause}'
        clauses.append(clause)
    expression = " || ".join(f"({c})" for c in clauses) if len(clauses) > 1 else clauses[0]
    if shared_exist and not any(o.kind == "shared" for o in tier):
        # Only where shared GPUs exist is the field declared (DRAConsumableCapacity).
        expression = f"({expression}) && !device.allowMultipleAllocations" if len(clauses) > 1 \
            else f"{expression} && !device.allowMultipleAllocations"
    return expression


def _tier_name(tier: list[_Offer], last: bool) -> str:
    if last:
        return "any-size"
    return f"upto-{-(-max(o.memory for o in tier) // GIB)}gi"


def _offer_label(offer: _Offer) -> str:
    what = f"MIG {offer.label}" if offer.kind == "mig" else f"{'shared ' if offer.kind == 'shared' else ''}{offer.label}"
    return f"{what} ({human_bytes(offer.memory)})"


def vram_request_error(memory: Any) -> str | None:
    """What is wrong with a ``capacity.requests.memory`` value, with the fix (None: a positive
    quantity). ``-1Gi`` or ``0`` would be allocated as "at least nothing": any device."""
    try:
        amount = parse_quantity(memory)
    except (QuantityError, TypeError):
        return f"{memory!r} is not a quantity: write the VRAM wanted, e.g. 16Gi"
    if amount <= 0:
        return (f"{memory} asks for no VRAM: request a positive amount, e.g. 16Gi, or drop "
                "capacity.requests.memory to take a whole device")
    return None


def shape_vram_request(request: dict[str, Any], inventory: Inventory, memory_class: str) -> ShapingResult:
    """Shape one claim request (``{"name": ..., "exactly": {...}}``) by its VRAM request.

    Requests that are not ``exactly`` requests of ``memory_class`` with ``capacity.requests.memory``
    (or that ask for admin access, which ``firstAvailable`` cannot carry) come back unchanged.
    """
    original = copy.deepcopy(request)
    body = request.get("exactly")
    unchanged = ShapingResult(request=original, original=original)
    if not isinstance(body, dict) or body.get("deviceClassName") != memory_class or body.get("adminAccess"):
        return unchanged
    memory_text = ((body.get("capacity") or {}).get("requests") or {}).get("memory")
    if memory_text is None:
        return unchanged
    name = str(request.get("name", ""))
    error = vram_request_error(memory_text)
    if error is not None:  # left as written: the validating webhook refuses it with the field's path
        return ShapingResult(request=original, original=original, warning=f"request {name}: {error}")
    try:
        alt = parse_alternative(body, name, name, 0, "exactly", False)
        without_memory = parse_alternative({**body, "capacity": None}, name, name, 0, "exactly", False)
    except SpecError as exc:
        return ShapingResult(request=original, original=original, warning=f"request {name}: {exc}")
    wanted = alt.capacity["memory"]
    fitting = prepare_alternative(alt, inventory)
    if fitting.error:
        return ShapingResult(request=original, original=original, warning=fitting.error)
    offers = _offers(fitting, inventory)
    if not offers:
        existing = _offers(prepare_alternative(without_memory, inventory), inventory)
        if not existing:
            warning = (f"no published device matches DeviceClass {memory_class!r} and the request's "
                       "selectors and tolerations")
        else:
            biggest = max(existing, key=lambda o: o.memory)
            what = f"MIG {biggest.label}" if biggest.kind == "mig" else biggest.label
            warning = (f"no device has {human_bytes(wanted)}; the largest is {what} with "
                       f"{human_bytes(biggest.memory)}")
        return ShapingResult(request=original, original=original, warning=warning)
    shared_exist = any(s.representative.allow_multiple_allocations for s in inventory.shapes)
    user_selectors = list(body.get("selectors") or [])
    entries: list[dict[str, Any]] = []
    labels: list[str] = []
    grouped = tiers(offers)
    for i, tier in enumerate(grouped):
        last = i == len(grouped) - 1
        entry: dict[str, Any] = {
            "name": _tier_name(tier, last),
            "deviceClassName": memory_class,
            "selectors": [
                *copy.deepcopy(user_selectors),
                {"cel": {"expression": _tier_selector(tier, str(memory_text), last, shared_exist)}},
            ],
        }
        for key in ("allocationMode", "count", "tolerations"):
            if body.get(key) is not None:
                entry[key] = copy.deepcopy(body[key])
        if any(o.kind == "shared" for o in tier):
            entry["capacity"] = copy.deepcopy(body["capacity"])
        entries.append(entry)
        span = "any size" if last else f"up to {human_bytes(max(o.memory for o in tier))}"
        labels.append(f"{span}: {', '.join(_offer_label(o) for o in tier)}")
    shaped = {"name": name, "firstAvailable": entries}
    return ShapingResult(request=shaped, original=original, changed=True, entries=labels)


@dataclass
class ClaimShaping:
    """The result of shaping every request of one claim (or claim template) spec."""

    devices: dict[str, Any]  # the new spec.devices
    changed: bool
    warnings: list[str]
    annotation: str | None  # value for ORIGINAL_ANNOTATION when something changed


def shape_device_claim(devices: dict[str, Any], inventory: Inventory, memory_class: str,
                       existing_annotation: str | None = None) -> ClaimShaping:
    """Shape each request of a ``spec.devices`` (ResourceClaim or ResourceClaimTemplate ``spec.spec``).

    Constraints and config keep working: they name requests, and a reference to a request covers
    all of its firstAvailable entries.
    """
    new = copy.deepcopy(devices)
    warnings: list[str] = []
    annotation = existing_annotation
    changed = False
    for i, request in enumerate(new.get("requests") or []):
        result = shape_vram_request(request, inventory, memory_class)
        if result.warning:
            warnings.append(f"request {request.get('name')}: {result.warning}")
        if result.changed:
            new["requests"][i] = result.request
            annotation = result.annotation(annotation)
            changed = True
    return ClaimShaping(new, changed, warnings, annotation if changed else None)
