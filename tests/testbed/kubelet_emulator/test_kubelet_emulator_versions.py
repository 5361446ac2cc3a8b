"""How the kubelet emulator validates GetInfo answers and picks services (pure rules, no sockets)."""

from __future__ import annotations

import pytest

from testbed.kubelet_emulator import (
    RegistrationRejected,
    select_dra_service,
    select_health_services,
    validate_plugin_info,
)


@pytest.mark.parametrize(
    ("versions", "expected"),
    [
        (["v1.DRAPlugin", "v1beta1.DRAPlugin"], "v1"),  # what the Go helper advertises
        (["v1beta1.DRAPlugin"], "v1beta1"),  # a driver built for 1.32/1.33
        (["v1beta1.DRAPlugin", "v1.DRAPlugin"], "v1beta1"),  # the plugin's order decides, not ours
        (["v1alpha1.DRAResourceHealth", "v1.DRAPlugin"], "v1"),  # health ids are skipped over
        (["v1alpha3.NodeService", "v1beta1.DRAPlugin"], "v1beta1"),  # removed in 1.34: skipped
    ],
)
def test_first_supported_dra_service_in_plugin_order(versions: list[str], expected: str) -> None:
    assert select_dra_service(versions) == expected


def test_no_supported_service_is_rejected_with_the_list() -> None:
    with pytest.raises(RegistrationRejected, match=r"none of services supported by the plugin .*v1alpha3"):
        select_dra_service(["v1alpha3.NodeService", "v1.DRAResourceHealth"])
    with pytest.raises(RegistrationRejected, match="empty list of supported versions"):
        select_dra_service([])
    # Near misses are not accepted: these are service ids, not bare versions or full gRPC names.
    for wrong in ("v1", "DRAPlugin", "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin", "V1.DRAPlugin"):
        with pytest.raises(RegistrationRejected):
            select_dra_service([wrong])


def test_health_service_preference_is_v1_then_v1alpha1() -> None:
    both = ["v1.DRAPlugin", "v1alpha1.DRAResourceHealth", "v1.DRAResourceHealth"]
    assert select_health_services(both) == ("v1", "v1alpha1")
    assert select_health_services(["v1.DRAPlugin", "v1alpha1.DRAResourceHealth"]) == ("v1alpha1",)
    assert select_health_services(["v1.DRAPlugin"]) == ()


def test_validate_plugin_info_checks_type_name_and_endpoint() -> None:
    ok = validate_plugin_info("DRAPlugin", "gpu.nvidia.com", "/p/dra.sock", ["v1.DRAPlugin"], "/r/x-reg.sock")
    assert ok.dra_service == "v1" and ok.health_services == ()
    with pytest.raises(RegistrationRejected, match="no handler registered for plugin type: CSIPlugin"):
        validate_plugin_info("CSIPlugin", "gpu.nvidia.com", "/p/dra.sock", ["v1.DRAPlugin"], "/r/x-reg.sock")
    with pytest.raises(RegistrationRejected, match="empty name"):
        validate_plugin_info("DRAPlugin", "", "/p/dra.sock", ["v1.DRAPlugin"], "/r/x-reg.sock")
    with pytest.raises(RegistrationRejected, match="empty endpoint"):
        validate_plugin_info("DRAPlugin", "gpu.nvidia.com", "", ["v1.DRAPlugin"], "/r/x-reg.sock")
