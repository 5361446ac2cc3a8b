"""The planning engine: pure functions over published devices and claims (no I/O).

Inputs are raw API objects as dicts (camelCase, as the API server or ``CustomObjectsApi`` returns
them). Typical use by the controller (webhook, placement mode, explain) and the demo allocator::

    from controller.planning import build_inventory, plan, allocate_and_reserve, explain
    from controller.planning import shape_device_claim, shape_vram_request

    inv = build_inventory(slices, claims, device_classes)      # newest complete pools only;
                                                               # .skipped: what was left out and why
                                                               # (the caller logs it: no I/O here)
    result = plan(claim, inv, policy="binpack")                # .allocation (status.allocation JSON),
                                                               # .node_name, .reasons, .chosen
    out = allocate_and_reserve(claim, inv, pod)                # .patch = {"status": {allocation, reservedFor}}
    inv.add_claim(allocated_claim)                             # in place, one pool; remove_claim() undoes
    shaped = shape_device_claim(spec_devices, inv, "vram.gpu.nvidia.com")  # .devices, .warnings, .annotation
    print(explain(claim, inv, unhealthy_from_node_conditions(nodes)).render())

CEL: ``compile_selector(expr) -> CompiledSelector`` (cached by text; ``CelCompileError`` names the
problem) with ``.matches(device_view)`` / ``.evaluate(device_view) -> SelectorResult``.

Threads: an :class:`Inventory` is read-only for ``plan``/``explain``/shaping, so any number of
threads may use one at once; ``add_claim``/``remove_claim`` mutate it, so the owner either
serialises them with its own lock or swaps in a rebuilt inventory. Compiled selectors are shared
and thread-safe.
"""

from controller.planning.cel import CelCompileError, CompiledSelector, SelectorResult, compile_selector
from controller.planning.cluster_inventory import Inventory, Skipped, build_inventory
from controller.planning.device_view import DeviceView
from controller.planning.explain import Explanation, explain, unhealthy_from_node_conditions
from controller.planning.planner import PlanResult, plan
from controller.planning.reserve import ReserveResult, allocate_and_reserve
from controller.planning.shaping import (
    ORIGINAL_ANNOTATION,
    ClaimShaping,
    ShapingResult,
    shape_device_claim,
    shape_vram_request,
)

__all__ = [
    "ORIGINAL_ANNOTATION",
    "CelCompileError",
    "ClaimShaping",
    "CompiledSelector",
    "DeviceView",
    "Explanation",
    "Inventory",
    "PlanResult",
    "ReserveResult",
    "SelectorResult",
    "ShapingResult",
    "Skipped",
    "allocate_and_reserve",
    "build_inventory",
    "compile_selector",
    "explain",
    "plan",
    "shape_device_claim",
    "shape_vram_request",
    "unhealthy_from_node_conditions",
]
