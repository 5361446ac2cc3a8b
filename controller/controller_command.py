"""``gpuready controller``: the cluster-wide daemon (webhooks, claim health, leader election, --allocate).

Every flag falls back to an environment variable (the Helm chart sets those), then to a default.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from typing import Any

from dra_driver.logs import get_logger

log = get_logger(__name__)

DESCRIPTION = """\
The cluster-wide half of gpuready. Every replica serves two admission webhooks over HTTPS:
/mutate turns a memory request of the VRAM DeviceClass (capacity.requests.memory) into a best-fit
firstAvailable list of the GPU and MIG shapes that exist, smallest first, and warns when no device
could ever fit; /validate refuses opaque configuration for this driver that the kubelet plugin
would reject, naming the field. The replica holding the leader Lease also watches allocated
claims: when a device turns unhealthy it sets a Ready=False condition on the claim's
status.devices entry, records an Event on the pods using it and, with --on-device-failure=evict,
evicts pods that have a controller so they are recreated on a healthy device.

--allocate makes the leader also do the scheduler's DRA work (claims from templates, allocation
with the VRAM-aware planner, binding, deallocation): for the local demo cluster, which runs no
kube-scheduler. Never use it beside a real scheduler.

--placement-mode gated: pods that carry the scheduling gate <driver name>/placement get their claims
allocated by the leader with the same planner (all on one node), then the gate is lifted and
kube-scheduler reserves and binds, honouring the allocation. A pod whose claims fit nowhere gets a
PlacementFailed Event and its gate lifted all the same.

Examples:
  gpuready controller --kubeconfig ~/.kube/config --webhook-cert-dir /etc/gpuready/webhook-tls
  gpuready controller --kubeconfig kc.yaml --allocate --no-leader-elect --webhook-port 0
"""


def _env(name: str, default: str) -> str:
    return os.environ.get(name) or default


def _env_bool(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    return value.strip().lower() in ("1", "true", "yes", "on")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``gpuready controller`` (environment variable fallbacks in brackets).

    Numeric defaults stay strings: argparse converts them with the flag's type only when this
    subcommand runs, so a bad value in the environment is reported against its flag and never
    breaks the other subcommands' parsers."""
    parser.add_argument("--kubeconfig", default=_env("KUBECONFIG", ""),
                        help="kubeconfig file; empty: the service account inside a pod, else ~/.kube/config [KUBECONFIG]")
    parser.add_argument("--driver-name", default=_env("DRIVER_NAME", "gpu.nvidia.com"),
                        help="DRA driver name whose devices and configs this controller handles [DRIVER_NAME]")
    parser.add_argument("--memory-class", default=_env("MEMORY_DEVICE_CLASS", ""),
                        help="DeviceClass whose memory requests are shaped (default vram.<driver name>) "
                             "[MEMORY_DEVICE_CLASS]")
    parser.add_argument("--policy", default=_env("PLACEMENT_POLICY", "binpack"), choices=["binpack", "spread"],
                        help="placement policy for --placement-mode gated and --allocate [PLACEMENT_POLICY]")
    parser.add_argument("--placement-mode", default=_env("PLACEMENT_MODE", "off"), choices=["off", "gated"],
                        help="gated: the leader allocates the claims of pods carrying the scheduling gate "
                             "<driver name>/placement, then lifts the gate for kube-scheduler [PLACEMENT_MODE]")
    parser.add_argument("--on-device-failure", default=_env("UNHEALTHY_CLAIM_POLICY", "none"),
                        choices=["none", "evict"],
                        help="none: condition and Events only; evict: also evict pods that have a controller "
                             "[UNHEALTHY_CLAIM_POLICY]")
    parser.add_argument("--readiness-taint-mode", default=_env("READINESS_TAINT_MODE", "off"),
                        choices=["off", "bootstrap-only", "continuous"],
                        help="GPUReady gates the node: bootstrap-only removes the readiness taint from a node once "
                             "its GPUReady condition is True; continuous also adds it back whenever GPUReady is "
                             "not True [READINESS_TAINT_MODE]")
    parser.add_argument("--readiness-taint", default=_env("READINESS_TAINT", "readiness.k8s.io/GPUReady"),
                        help="the readiness taint's key (value pending, effect NoSchedule) [READINESS_TAINT]")
    parser.add_argument("--allocate", action=argparse.BooleanOptionalAction, default=_env_bool("ALLOCATE", False),
                        help="allocate claims and bind pods (local clusters without kube-scheduler) [ALLOCATE]")
    parser.add_argument("--webhook-port", type=int,
                        default=os.environ.get("WEBHOOK_PORT") or None,
                        help="HTTPS port of the webhooks; 0 turns them off (default 8443 when a certificate is "
                             "given, else off) [WEBHOOK_PORT]")
    parser.add_argument("--webhook-cert-dir", default=_env("WEBHOOK_CERT_DIR", ""),
                        help="directory holding tls.crt and tls.key [WEBHOOK_CERT_DIR]")
    parser.add_argument("--webhook-cert", default=_env("WEBHOOK_CERT", ""), help="certificate file (PEM) [WEBHOOK_CERT]")
    parser.add_argument("--webhook-key", default=_env("WEBHOOK_KEY", ""), help="private key file (PEM) [WEBHOOK_KEY]")
    parser.add_argument("--timeslice-interval", choices=("ignore", "apply"), default=_env("TIMESLICE_INTERVAL", "ignore"),
                        help="a claim's sharing time-slice interval other than Default changes a GPU-wide setting: "
                             "ignore admits such claims with a warning that the GPU keeps its time slice; apply "
                             "admits them silently (only where the kubelet plugins apply it; the chart's "
                             "timeSliceInterval sets both) [TIMESLICE_INTERVAL]")
    parser.add_argument("--metrics-port", type=int, default=_env("METRICS_PORT", "8080"),
                        help="Prometheus /metrics port; 0 turns it off [METRICS_PORT]")
    parser.add_argument("--health-port", type=int, default=_env("HEALTH_PORT", "8081"),
                        help="/healthz and /readyz port; 0 turns it off [HEALTH_PORT]")
    parser.add_argument("--bind-address", default=_env("BIND_ADDRESS", "0.0.0.0"),
                        help="address the servers listen on unless their own flag below names one [BIND_ADDRESS]")
    parser.add_argument("--webhook-bind-address", default=_env("WEBHOOK_BIND_ADDRESS", ""),
                        help="address the webhooks listen on (default --bind-address) [WEBHOOK_BIND_ADDRESS]")
    parser.add_argument("--metrics-bind-address", default=_env("METRICS_BIND_ADDRESS", ""),
                        help="address /metrics listens on, e.g. 127.0.0.1 behind a local proxy "
                             "(default --bind-address) [METRICS_BIND_ADDRESS]")
    parser.add_argument("--health-bind-address", default=_env("HEALTH_BIND_ADDRESS", ""),
                        help="address /healthz and /readyz listen on (default --bind-address) [HEALTH_BIND_ADDRESS]")
    parser.add_argument("--leader-elect", action=argparse.BooleanOptionalAction,
                        default=_env_bool("LEADER_ELECT", True),
                        help="elect one leader through a Lease (required with more than one replica) [LEADER_ELECT]")
    parser.add_argument("--leader-election-namespace",
                        default=_env("LEADER_ELECTION_NAMESPACE", _env("POD_NAMESPACE", "default")),
                        help="namespace of the Lease [LEADER_ELECTION_NAMESPACE, POD_NAMESPACE]")
    parser.add_argument("--leader-election-lease-name", default=_env("LEADER_ELECTION_LEASE_NAME", "gpuready-controller"),
                        help="name of the Lease [LEADER_ELECTION_LEASE_NAME]")
    parser.add_argument("--leader-election-id", default=_env("POD_NAME", ""),
                        help="this replica's identity in the Lease (default hostname_pid) [POD_NAME]")
    parser.add_argument("--lease-duration", type=float, default=_env("LEASE_DURATION", "15"),
                        help="seconds a standby waits after the last renewal before taking over [LEASE_DURATION]")
    parser.add_argument("--renew-deadline", type=float, default=_env("RENEW_DEADLINE", "10"),
                        help="seconds the leader keeps trying to renew before stepping down [RENEW_DEADLINE]")
    parser.add_argument("--retry-period", type=float, default=_env("RETRY_PERIOD", "2"),
                        help="seconds between Lease attempts [RETRY_PERIOD]")
    parser.add_argument("--plugin-heartbeat-threshold", type=float,
                        default=_env("PLUGIN_HEARTBEAT_THRESHOLD", "0"),
                        help="seconds a node's kubelet plugin may go without renewing its heartbeat Lease before "
                             "the leader taints the node's pool NoSchedule (a DeviceTaintRule) and sets GPUReady "
                             "to PluginNotRunning; 0 turns the watch off [PLUGIN_HEARTBEAT_THRESHOLD]")
    parser.add_argument("--plugin-handover-grace", type=float, default=_env("PLUGIN_HANDOVER_GRACE", "30"),
                        help="seconds a heartbeat released by a graceful stop (rolling update, restart) waits for "
                             "the next plugin pod before the node counts as down [PLUGIN_HANDOVER_GRACE]")
    parser.add_argument("--taint-rule-owner", default=_env("TAINT_RULE_OWNER", ""),
                        help="ClusterRole that owns the DeviceTaintRules the controller adds, so deleting it "
                             "(helm uninstall) deletes them [TAINT_RULE_OWNER]")
    parser.add_argument("--resync", type=float, default=_env("RESYNC_SECONDS", "30"),
                        help="seconds between full reconciler passes without changes [RESYNC_SECONDS]")


def config_from_args(args: argparse.Namespace) -> Any:
    """A validated :class:`controller.daemon.ControllerConfig` from the parsed flags (ValueError if bad)."""
    from controller.daemon import ControllerConfig

    cert, key = args.webhook_cert, args.webhook_key
    if args.webhook_cert_dir:
        cert = cert or os.path.join(args.webhook_cert_dir, "tls.crt")
        key = key or os.path.join(args.webhook_cert_dir, "tls.key")
    webhook_port = args.webhook_port
    if webhook_port is None:  # the chart sets no port when its webhook is disabled: serve none then
        webhook_port = 8443 if cert and key else 0
    return ControllerConfig(
        driver_name=args.driver_name, memory_class=args.memory_class, policy=args.policy,
        webhook_port=webhook_port or None, cert_file=cert, key_file=key,
        metrics_port=args.metrics_port or None, health_port=args.health_port or None,
        webhook_host=args.webhook_bind_address or args.bind_address, bind_host=args.bind_address,
        metrics_host=args.metrics_bind_address, health_host=args.health_bind_address,
        leader_elect=args.leader_elect, lease_namespace=args.leader_election_namespace,
        lease_name=args.leader_election_lease_name, identity=args.leader_election_id,
        lease_duration=args.lease_duration, renew_deadline=args.renew_deadline, retry_period=args.retry_period,
        allocate=args.allocate, placement_mode=args.placement_mode,
        on_device_failure=args.on_device_failure, resync_s=args.resync,
        readiness_taint_mode=args.readiness_taint_mode, readiness_taint_key=args.readiness_taint,
        plugin_heartbeat_threshold=args.plugin_heartbeat_threshold,
        plugin_handover_grace=args.plugin_handover_grace, taint_rule_owner=args.taint_rule_owner,
        timeslice_interval=args.timeslice_interval,
    )


def _fail(code: int, event: str, **fields: Any) -> int:
    """Report why the controller cannot run as one line on stderr and return the exit code.

    One structured event when logging is configured (``gpuready controller`` configures it before
    running), so JSON log parsers see no plain line; a caller that runs this without configuring
    logging gets one plain message instead, which Python's last-resort handler would cut to the
    event name."""
    if logging.getLogger().handlers:
        log.error(event, **fields)
    else:
        detail = "; ".join(f"{k}: {v}" for k, v in fields.items() if v is not None)
        print(f"gpuready controller: {event}: {detail}", file=sys.stderr)
    return code


def run(args: argparse.Namespace) -> int:
    """Run until SIGTERM/SIGINT; the leader releases its Lease on the way out."""
    from controller.daemon import Controller
    from dra_driver.kube_api import connect

    try:
        config = config_from_args(args)
        if config.leader_elect:
            from controller.leader import LeaseConfig

            LeaseConfig(config.lease_namespace, config.lease_name, config.identity_name, config.lease_duration,
                        config.renew_deadline, config.retry_period)
    except ValueError as exc:
        return _fail(2, "invalid_configuration", error=str(exc))
    try:
        # The node daemon's connection: a kubeconfig with a certificate or token (and a pod's service
        # account) needs no `kubernetes` package, whose import was 0.4-1.7 s of the controller's
        # start; exec plugins and auth providers still go through it.
        client = connect(args.kubeconfig)
    except Exception as exc:
        return _fail(2, "kube_client_config_failed", kubeconfig=args.kubeconfig or None, error=str(exc),
                     fix="give --kubeconfig, or run in a pod with a service account")
    done = threading.Event()

    def _on_signal(signum: int, _frame: Any) -> None:
        log.info("controller_signal", signal=signal.Signals(signum).name)
        done.set()

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    try:
        controller = Controller(config, client).start()
    except (OSError, ValueError) as exc:
        return _fail(1, "controller_start_failed", error=str(exc))
    done.wait()
    controller.stop()
    return 0
