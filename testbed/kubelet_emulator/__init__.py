"""A kubelet emulator: registers DRA plugins over their registration socket and calls them like the kubelet.

Used by tests and by the demo::

    from testbed.kubelet_emulator import KubeletEmulator
    with KubeletEmulator(registry_dir) as emu:
        plugin = emu.wait_for_plugin("gpu.nvidia.com")
        results = plugin.prepare([("default", "my-claim", claim_uid)])

With ``pod_resources_socket`` it also serves the kubelet's PodResources API (``set_pod`` says which
containers use which claims). Everything travels over real gRPC on Unix sockets with the wire-exact protos in ``proto/``.

The kubelet's API side, for a cluster of emulated nodes: ``NodeHeartbeat`` keeps the Node ``Ready``;
``PodRunner`` prepares the claims of every pod bound to the node, marks it Running and unprepares
when it goes.
"""

from testbed.kubelet_emulator.emulator import KubeletEmulator, RegistrationAttempt
from testbed.kubelet_emulator.node_heartbeat import NodeHeartbeat
from testbed.kubelet_emulator.plugin import (
    DEFAULT_CALL_TIMEOUT,
    ClaimRef,
    DeviceHealthReport,
    KubeletError,
    PluginCallError,
    PreparedDevice,
    PrepareResult,
    RegisteredPlugin,
)
from testbed.kubelet_emulator.pod_resources import PodResourcesServer, PreparedClaimDevice
from testbed.kubelet_emulator.pod_runner import PodRunner
from testbed.kubelet_emulator.versions import (
    DRA_PLUGIN_TYPE,
    PluginChoice,
    RegistrationRejected,
    select_dra_service,
    select_health_services,
    validate_plugin_info,
)

__all__ = [
    "DEFAULT_CALL_TIMEOUT",
    "DRA_PLUGIN_TYPE",
    "ClaimRef",
    "DeviceHealthReport",
    "KubeletEmulator",
    "KubeletError",
    "NodeHeartbeat",
    "PluginCallError",
    "PluginChoice",
    "PodResourcesServer",
    "PodRunner",
    "PrepareResult",
    "PreparedClaimDevice",
    "PreparedDevice",
    "RegisteredPlugin",
    "RegistrationAttempt",
    "RegistrationRejected",
    "select_dra_service",
    "select_health_services",
    "validate_plugin_info",
]
