"""How the kubelet validates a DRA plugin's GetInfo answer and picks the services it will call.

Pure functions, no I/O, following the kubelet 1.34+ DRA plugin manager as described in
the kubelet's plugin watcher and health stream: the plugin's ``supported_versions`` are gRPC service
ids (``"<package short name>.<service>"``), walked **in the plugin's order**; the first DRA node
service the kubelet also speaks wins. The health service is chosen separately, v1 before v1alpha1.
"""

from __future__ import annotations

from dataclasses import dataclass

DRA_PLUGIN_TYPE = "DRAPlugin"

# Advertised id -> short version name used throughout the emulator.
DRA_SERVICES: dict[str, str] = {"v1.DRAPlugin": "v1", "v1beta1.DRAPlugin": "v1beta1"}
HEALTH_SERVICES: dict[str, str] = {"v1.DRAResourceHealth": "v1", "v1alpha1.DRAResourceHealth": "v1alpha1"}
# A 1.37 kubelet prefers the v1 health API; 1.34-1.36 kubelets only know v1alpha1.
HEALTH_PREFERENCE: tuple[str, ...] = ("v1", "v1alpha1")


class RegistrationRejected(Exception):
    """The kubelet would refuse this plugin; the message is what it sends in RegistrationStatus.error."""


@dataclass(frozen=True)
class PluginChoice:
    """What the kubelet decided to use for a validated plugin."""

    dra_service: str  # "v1" or "v1beta1"
    health_services: tuple[str, ...]  # advertised health versions, most preferred first; may be empty


def select_dra_service(versions: list[str]) -> str:
    """Return the DRA node service ("v1" or "v1beta1") the kubelet would use, or raise RegistrationRejected.

    The first advertised id the kubelet supports wins, so a plugin listing
    ``["v1beta1.DRAPlugin", "v1.DRAPlugin"]`` is served over v1beta1.
    """
    if not versions:
        raise RegistrationRejected('empty list of supported versions: advertise at least "v1.DRAPlugin"')
    for version in versions:
        if version in DRA_SERVICES:
            return DRA_SERVICES[version]
    raise RegistrationRejected(
        f"none of services supported by the plugin {versions} are supported by the kubelet "
        f"{list(DRA_SERVICES)}"
    )


def select_health_services(versions: list[str]) -> tuple[str, ...]:
    """Return the health service versions the plugin advertised, in the kubelet's order of preference."""
    advertised = {HEALTH_SERVICES[v] for v in versions if v in HEALTH_SERVICES}
    return tuple(v for v in HEALTH_PREFERENCE if v in advertised)


def validate_plugin_info(
    plugin_type: str, name: str, endpoint: str, versions: list[str], socket_path: str
) -> PluginChoice:
    """Validate a GetInfo answer the way the kubelet does; raise RegistrationRejected with its reason."""
    if plugin_type != DRA_PLUGIN_TYPE:
        # The plugin watcher dispatches on type; only DRA is handled here.
        raise RegistrationRejected(
            f"RegisterPlugin error -- no handler registered for plugin type: {plugin_type} "
            f'at socket {socket_path} (a DRA driver must answer type "{DRA_PLUGIN_TYPE}")'
        )
    if not name:
        raise RegistrationRejected(
            f"plugin at socket {socket_path} answered an empty name: set it to the driver name"
        )
    if not endpoint:
        raise RegistrationRejected(
            f"plugin {name} answered an empty endpoint: set it to the absolute path of its DRA socket"
        )
    return PluginChoice(
        dra_service=select_dra_service(versions), health_services=select_health_services(versions)
    )
