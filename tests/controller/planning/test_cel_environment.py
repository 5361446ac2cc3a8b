"""Compile errors a user can act on, and results cached by exactly the values an expression reads."""

from __future__ import annotations

from fractions import Fraction

import pytest

from controller.planning.cel import CelCompileError, CompiledSelector, compile_selector
from controller.planning.device_view import DeviceView


def _gpu(index: int, product: str = "NVIDIA H100 80GB HBM3", memory_gib: int = 80) -> DeviceView:
    return DeviceView(
        driver="gpu.nvidia.com",
        pool="node-1",
        name=f"gpu-{index}",
        node="node-1",
        attributes={
            "gpu.nvidia.com/productName": product,
            "gpu.nvidia.com/uuid": f"GPU-{index:08d}",
            "gpu.nvidia.com/index": index,
        },
        capacity={"gpu.nvidia.com/memory": Fraction(memory_gib * 1024**3)},
    )


@pytest.mark.parametrize(
    ("expression", "names"),
    [
        ('device.attributes["gpu.nvidia.com"].model ==', "syntax error"),
        ("device.driver &&& true", "syntax error at line 1, column 17"),
        ("device.model == 'x'", "undefined field 'model'"),
        ("gpu.attributes == 1", "undeclared reference to 'gpu'"),
        ('frobnicate(device.driver)', "undeclared reference to function 'frobnicate'"),
        ('device.attributes["x"].?y.orValue("")', "guard with has()"),
        ("", "empty CEL expression"),
        ("true || " * 2000 + "true", "Kubernetes allows 10240"),
    ],
)
def test_compile_errors_name_the_problem(expression: str, names: str) -> None:
    with pytest.raises(CelCompileError, match=None) as info:
        compile_selector(expression)
    assert names in str(info.value)


def test_compiled_selectors_are_cached_by_text() -> None:
    expr = 'device.attributes["gpu.nvidia.com"].productName == "NVIDIA H200"'
    assert compile_selector(expr) is compile_selector(expr)


def test_identical_devices_share_one_evaluation(monkeypatch: pytest.MonkeyPatch) -> None:
    sel = compile_selector('device.attributes["gpu.nvidia.com"].productName.startsWith("NVIDIA H1") && true')
    calls: list[str] = []
    original = CompiledSelector._evaluate

    def counting(self: CompiledSelector, device: DeviceView):  # type: ignore[no-untyped-def]
        calls.append(device.name)
        return original(self, device)

    monkeypatch.setattr(CompiledSelector, "_evaluate", counting)
    devices = [_gpu(i) for i in range(50)] + [_gpu(99, product="NVIDIA A100-SXM4-40GB")]
    results = [sel.matches(d) for d in devices]
    # 50 H100s differ only in uuid/index, which the expression does not read: one evaluation.
    assert results == [True] * 50 + [False]
    assert len(calls) == 2


def test_cache_key_distinguishes_present_from_missing_attribute() -> None:
    sel = compile_selector('has(device.attributes["gpu.nvidia.com"].mig) ? false : true')
    with_mig = _gpu(1)
    with_mig.attributes["gpu.nvidia.com/mig"] = True
    assert sel.matches(_gpu(0)) is True
    assert sel.matches(with_mig) is False


def test_expression_reading_a_whole_domain_is_not_shared_across_different_devices() -> None:
    sel = compile_selector('cel.bind(a, device.attributes["gpu.nvidia.com"], a.index == 3)')
    assert [sel.matches(_gpu(i)) for i in range(5)] == [False, False, False, True, False]


def test_non_boolean_result_is_an_error_not_a_match() -> None:
    result = compile_selector('device.attributes["gpu.nvidia.com"].index').evaluate(_gpu(1))
    assert result.matched is False and result.error is not None and "bool" in result.error


def test_quantity_errors_are_runtime_errors_with_the_text() -> None:
    result = compile_selector('device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("lots")) > 0').evaluate(_gpu(0))
    assert result.matched is False and result.error is not None and "lots" in result.error


def test_one_selector_evaluated_from_many_threads_gives_consistent_answers() -> None:
    import threading

    sel = compile_selector('device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("40Gi")) >= 0 && '
                           'device.attributes["gpu.nvidia.com"].index % 2 == 0')
    devices = [_gpu(i, memory_gib=20 + (i % 5) * 20) for i in range(200)]
    expected = [(20 + (i % 5) * 20) >= 40 and i % 2 == 0 for i in range(200)]
    failures: list[str] = []

    def work() -> None:
        for _ in range(3):
            got = [sel.matches(d) for d in devices]
            if got != expected:
                failures.append("mismatch")

    threads = [threading.Thread(target=work) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures
