"""An alternative made ready to plan: its compiled selectors and the device shapes that pass them.

Shared by the planner, the scheduler-parity checks and VRAM shaping; pure, no I/O. Selectors are
evaluated in the scheduler's order (:func:`first_verdict`): class selectors first, stop at the first
false or error.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from controller.planning.cel import CelCompileError, CompiledSelector, SelectorResult, compile_selector
from controller.planning.cluster_inventory import Inventory, Shape
from controller.planning.device_view import DeviceView, Taint, fit_key
from controller.planning.requests import Alternative, capacity_demand, untolerated


def first_verdict(selectors: list[CompiledSelector],
                  device: DeviceView) -> tuple[CompiledSelector, SelectorResult] | None:
    """Evaluate selectors in order as the scheduler does (class first, stop at the first false or
    error); the selector that stopped it with its result, or None when every one matched."""
    for s in selectors:
        r = s.evaluate(device)
        if r.error is not None or not r.matched:
            return s, r
    return None


@dataclass
class AltPlan:
    """An alternative with its compiled selectors and the shapes that can serve it."""

    alt: Alternative
    selectors: list[CompiledSelector]
    per_device: list[CompiledSelector]  # selectors that read identity attributes
    shapes: list[Shape]
    error: str | None = None
    # Shapes on which a selector fails at runtime: (shape, expression, error text).
    cel_errors: list[tuple[Shape, str, str]] = field(default_factory=list)
    tainted: list[tuple[DeviceView, Taint]] = field(default_factory=list)  # matched, but taint not tolerated


def shape_safe(selector: CompiledSelector, identity: frozenset[str]) -> bool:
    """Whether the selector gives the same answer for every device of a shape."""
    for path in selector.reads:
        if path[0] in ("all", "attrdom") or (path[0] == "attr" and path[1] in identity):
            return False
    return True


def prepare_alternative(alt: Alternative, inventory: Inventory) -> AltPlan:
    """Compile the class and request selectors and keep the shapes that pass them."""
    cls = inventory.classes.get(alt.device_class)
    if cls is None:
        return AltPlan(alt, [], [], [], f"DeviceClass {alt.device_class!r} does not exist")
    try:
        selectors = [compile_selector(e) for e in (*cls.selectors, *alt.selectors)]
    except CelCompileError as exc:
        return AltPlan(alt, [], [], [], f"request {alt.result_name}: {exc}")
    safe = [s for s in selectors if shape_safe(s, inventory.identity_attributes)]
    per_device = [s for s in selectors if s not in safe]
    shapes = []
    cel_errors: list[tuple[Shape, str, str]] = []
    tainted: list[tuple[DeviceView, Taint]] = []
    for shape in inventory.shapes:
        rep = shape.representative
        # Selectors first, whatever the device's taints or use: the scheduler evaluates them on
        # every device it walks, and a runtime error aborts the claim.
        stop = first_verdict(safe, rep)
        if stop is not None:
            if stop[1].error is not None:
                cel_errors.append((shape, stop[0].expression, stop[1].error))
            continue
        if capacity_demand(rep, alt)[0] is None:
            continue
        # allocationMode All takes every matching device: a taint fails the request, not the device.
        taint = untolerated(rep, alt) if not alt.all_devices else None
        if taint is not None:
            tainted.append((rep, taint))
            continue
        shapes.append(shape)
    shapes.sort(key=lambda s: (fit_key(s.representative), s.index))
    return AltPlan(alt, selectors, per_device, shapes, cel_errors=cel_errors, tainted=tainted)
