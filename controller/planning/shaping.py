"""VRAM shaping: turn "give me 15 GiB" into a best-fit prioritized list the scheduler understands.

The admission webhook calls :func:`shape_vram_request` for an ``exactly`` request of the
memory-sized DeviceClass that carries ``capacity.requests.memory``. The result replaces it with a
``firstAvailable`` list (at most 8 entries) of the device shapes that exist in the cluster and are
big enough, smallest first: the kube-scheduler's own allocator then lands on the best fit. Each
entry keeps the user's selectors, tolerations and count, pins its shape in CEL (MIG profile, or
product name and whether the GPU is shared) and repeats the memory floor in CEL, so an entry
can never match a device that is too small. Shared GPUs keep ``capacity.requests.memory``: there it
says how much of the GPU to consume.

Pure: reads an :class:`~controller.planning.cluster_inventory.Inventory`, returns new dicts.
"""

from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from controller.planning.alternatives import AltPlan, prepare_alternative
from controller.planning.cluster_inventory import Inventory, Shape
from controller.planning.parse import SpecError
from controller.planning.requests import parse_alternative
from dra_driver.ordering import shape_offer_key
from dra_driver.quantity import human_bytes

MAX_ENTRIES = 8  # firstAvailable limit
ORIGINAL_ANNOTATION = "gpuready.io/original-requests"
"""Claim (template) annotation: JSON map of request name -> the request as the user wrote it."""


@dataclass
class ShapingResult:
    """``request`` is what to write (the original when nothing changed); ``warning`` for the user."""

    request: dict[str, Any]
    original: dict[str, Any]
    changed: bool = False
    warning: str | None = None
    entries: list[str] = field(default_factory=list)  # "mig 1g.20gb (19.5 GiB)", in order

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


def _slug(text: str) -> str:
    return re.sub(r"-+", "-", re.sub(r"[^a-z0-9]", "-", text.lower())).strip("-")[:40].strip("-") or "x"


def _pin(offer: _Offer, shared_exist: bool) -> str:
    attrs = f'device.attributes["{offer.driver}"]'
    if offer.kind == "mig":
        return f'{attrs}.type == "mig" && {attrs}.profile == {json.dumps(offer.label)}'
    if offer.kind in ("gpu", "shared"):
        pin = f'{attrs}.type == "gpu" && {attrs}.productName == {json.dumps(offer.label)}'
        if offer.kind == "shared":
            return pin + " && device.allowMultipleAllocations"
        # Only where shared GPUs exist is the field declared (DRAConsumableCapacity).
        return pin + " && !device.allowMultipleAllocations" if shared_exist else pin
    return f'has({attrs}.productName) && {attrs}.productName == {json.dumps(offer.label)}'


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
    floor = f'device.capacity["{{driver}}"].memory.compareTo(quantity({json.dumps(str(memory_text))})) >= 0'
    user_selectors = list(body.get("selectors") or [])
    entries: list[dict[str, Any]] = []
    labels: list[str] = []
    names: set[str] = set()
    for offer in offers[:MAX_ENTRIES]:
        entry_name = f"{offer.kind}-{_slug(offer.label)}"[:63].strip("-")
        while entry_name in names:
            entry_name = f"{entry_name[:60]}-{len(names)}"
        names.add(entry_name)
        entry: dict[str, Any] = {
            "name": entry_name,
            "deviceClassName": memory_class,
            "selectors": [
                *copy.deepcopy(user_selectors),
                {"cel": {"expression": _pin(offer, shared_exist)}},
                {"cel": {"expression": floor.format(driver=offer.driver)}},
            ],
        }
        for key in ("allocationMode", "count", "tolerations"):
            if body.get(key) is not None:
                entry[key] = copy.deepcopy(body[key])
        if offer.kind == "shared":
            entry["capacity"] = copy.deepcopy(body["capacity"])
        entries.append(entry)
        what = f"MIG {offer.label}" if offer.kind == "mig" else f"{'shared ' if offer.kind == 'shared' else ''}{offer.label}"
        labels.append(f"{what} ({human_bytes(offer.memory)})")
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
