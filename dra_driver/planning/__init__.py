"""The planning engine: pure functions over published devices and claims (no I/O).

Entry points (see each module for details)::

    from dra_driver.planning import build_inventory, plan, explain, shape_vram_request
    inv = build_inventory(slices, claims, device_classes)       # raw API dicts, camelCase
    result = plan(claim, inv, policy="binpack")                 # PlanResult(.allocation, .node_name, .reasons)
    patch = allocate_and_reserve(claim, inv, pod).patch         # {"status": {"allocation", "reservedFor"}}
    shaped = shape_vram_request(request, inv, memory_class)     # ShapingResult(.request, .warning, ...)
    print(explain(claim, inv, unhealthy).render())

CEL: ``compile_selector(expr) -> CompiledSelector`` with ``.matches(device_view)``.
"""

from dra_driver.planning.cel import CelCompileError, CompiledSelector, SelectorResult, compile_selector
from dra_driver.planning.explain import Explanation, explain
from dra_driver.planning.inventory import Inventory, build_inventory
from dra_driver.planning.model import DeviceView
from dra_driver.planning.planner import PlanResult, plan
from dra_driver.planning.reserve import ReserveResult, allocate_and_reserve
from dra_driver.planning.shaping import ShapingResult, shape_vram_request

__all__ = [
    "CelCompileError",
    "CompiledSelector",
    "DeviceView",
    "Explanation",
    "Inventory",
    "PlanResult",
    "ReserveResult",
    "SelectorResult",
    "ShapingResult",
    "allocate_and_reserve",
    "build_inventory",
    "compile_selector",
    "explain",
    "plan",
    "shape_vram_request",
]
