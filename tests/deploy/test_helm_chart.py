"""The Helm chart, rendered by Helm's own engine (helm-python-sdk embeds Helm v4's Go library).

Each values set is rendered once per module; every rendered object is validated against the
Kubernetes 1.34 and 1.36 OpenAPI schemas (kubernetes-validate, strict: unknown fields fail).
"""

from __future__ import annotations

import base64
import datetime
import functools
import json
import re
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml

helm = pytest.importorskip("helm_python")
kubernetes_validate = pytest.importorskip("kubernetes_validate")

CHART = Path(__file__).resolve().parents[2] / "deploy" / "helm" / "gpuready"
RELEASE, NAMESPACE = "gpuready", "gpu-system"
KUBE_VERSIONS = ("1.34.0", "1.36.0")

VALUE_SETS: dict[str, dict[str, Any]] = {
    "default": {},
    "monitoring": {"monitoring": {"serviceMonitor": {"enabled": True, "labels": {"release": "kps"}},
                                  "prometheusRule": {"enabled": True}}},
    "cert-manager": {"webhook": {"certManager": {"enabled": True}}},
    "cert-manager-issuer": {"webhook": {"certManager": {"enabled": True,
                                                        "issuerRef": {"name": "corp-ca", "kind": "ClusterIssuer"}}}},
    "dynamic-taint-shared": {"migMode": "dynamic", "healthMode": "taint", "sharedGpus": True,
                             "xid": {"ignore": [13, 31], "fatal": [43]}},
    "custom-driver": {"driverName": "gpu.example.com", "deviceClasses": {"extendedResourceName": "example.com/gpu"}},
    "no-controller": {"controller": {"enabled": False}, "sharedGpus": ["gpu-0", "gpu-2"]},
    "shares": {"sharedGpus": True, "shareMode": 1000000, "gpuShareModes": {"gpu-1": "unlimited", "gpu-0": "4"}},
    "simulated-evict": {"nvml": {"source": "simulated", "simulatedProfile": "8xh100"},
                        "controller": {"unhealthyClaimPolicy": "evict", "replicas": 1},
                        "kubeletPlugin": {"vramAccounting": False}, "logLevel": "debug"},
    "health-off": {"healthMode": "off", "webhook": {"enabled": False}, "controller": {"healthPort": 8443}},
}


@functools.cache
def _chart() -> Any:
    return helm.Chart.load(str(CHART))


@functools.cache
def _render_cached(key: str) -> tuple[tuple[str, str], ...]:
    values = json.loads(key)
    out = _chart().render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
    return tuple(sorted(out.items()))


def render(values: dict[str, Any]) -> dict[str, str]:
    """Template path -> rendered text (NOTES.txt included)."""
    return dict(_render_cached(json.dumps(values, sort_keys=True)))


def objects(values: dict[str, Any]) -> list[dict[str, Any]]:
    """Every rendered Kubernetes object."""
    out: list[dict[str, Any]] = []
    for path, text in render(values).items():
        if path.endswith("NOTES.txt"):
            continue
        out.extend(d for d in yaml.safe_load_all(text) if d)
    return out


def find(values: dict[str, Any], kind: str, name_part: str = "") -> list[dict[str, Any]]:
    return [o for o in objects(values) if o["kind"] == kind and name_part in o["metadata"]["name"]]


def one(values: dict[str, Any], kind: str, name_part: str = "") -> dict[str, Any]:
    found = find(values, kind, name_part)
    assert len(found) == 1, f"expected one {kind} named *{name_part}*, got {[o['metadata']['name'] for o in found]}"
    return found[0]


# --- lint and schemas ------------------------------------------------------------------------------

@pytest.mark.parametrize("values_name", ["default", "monitoring", "dynamic-taint-shared", "custom-driver"])
def test_helm_lint_is_clean(values_name: str) -> None:
    report = helm.lint(str(CHART), VALUE_SETS[values_name], strict=True, namespace=NAMESPACE)
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


# Prometheus Operator and cert-manager kinds are CRDs: no upstream schema; check their required shape.
CRD_REQUIRED: dict[str, tuple[str, ...]] = {
    "PodMonitor": ("spec.selector", "spec.podMetricsEndpoints"),
    "ServiceMonitor": ("spec.selector", "spec.endpoints"),
    "PrometheusRule": ("spec.groups",),
    "Certificate": ("spec.secretName", "spec.issuerRef.name", "spec.dnsNames"),
    "Issuer": ("spec.selfSigned",),
}


def _dig(obj: dict[str, Any], dotted: str) -> Any:
    for part in dotted.split("."):
        obj = obj[part]
    return obj


_VALIDATED: set[tuple[str, str]] = set()


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
@pytest.mark.parametrize("values_name", sorted(VALUE_SETS))
def test_every_object_validates_against_kubernetes_schema(values_name: str, kube_version: str) -> None:
    objs = objects(VALUE_SETS[values_name])
    assert objs
    for obj in objs:
        if obj["kind"] in CRD_REQUIRED:
            for path in CRD_REQUIRED[obj["kind"]]:
                assert _dig(obj, path) is not None, f"{obj['kind']} lacks {path}"
            continue
        key = (kube_version, json.dumps(obj, sort_keys=True))
        if key in _VALIDATED:  # the same object from another values set: already checked
            continue
        try:
            kubernetes_validate.validate(obj, kube_version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{obj['kind']}/{obj['metadata']['name']} invalid on {kube_version} at "
                        f"{'.'.join(map(str, exc.path))}: {exc.message}")
        _VALIDATED.add(key)


def test_resource_names_are_unique_and_labelled() -> None:
    seen = set()
    for obj in objects({}):
        key = (obj["kind"], obj["metadata"].get("namespace", ""), obj["metadata"]["name"])
        assert key not in seen, f"duplicate {key}"
        seen.add(key)
        assert obj["metadata"]["labels"]["app.kubernetes.io/instance"] == RELEASE
        if obj["kind"] not in ("DeviceClass", "ClusterRole", "ClusterRoleBinding", "ValidatingAdmissionPolicy",
                               "ValidatingAdmissionPolicyBinding", "MutatingWebhookConfiguration",
                               "ValidatingWebhookConfiguration"):
            assert obj["metadata"]["namespace"] == NAMESPACE


# --- kubelet plugin DaemonSet ------------------------------------------------------------------------

def _env(container: dict[str, Any]) -> dict[str, Any]:
    """Plain env values; downward-API ones as 'fieldRef:<path>'."""
    return {e["name"]: e.get("value", f"fieldRef:{e.get('valueFrom', {}).get('fieldRef', {}).get('fieldPath')}")
            for e in container["env"]}


def _plugin_pod(values: dict[str, Any]) -> dict[str, Any]:
    pod: dict[str, Any] = one(values, "DaemonSet")["spec"]["template"]["spec"]
    return pod


def test_daemonset_mounts_host_paths_at_the_same_paths_the_kubelet_uses() -> None:
    pod = _plugin_pod({})
    container = pod["containers"][0]
    host = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert host["plugins-registry"] == "/var/lib/kubelet/plugins_registry"
    assert host["plugin-dir"] == "/var/lib/kubelet/plugins/gpu.nvidia.com"
    assert host["cdi"] == "/var/run/cdi"
    assert host["dev"] == "/dev"
    assert host["driver-root"] == "/"
    # The kubelet dials the socket path the plugin registers: it must be the same inside and out.
    for name in ("plugins-registry", "plugin-dir", "cdi", "dev"):
        assert mounts[name]["mountPath"] == host[name]
    assert mounts["driver-root"]["readOnly"] is True
    assert mounts["host-proc"]["readOnly"] is True and host["host-proc"] == "/proc"
    env = _env(container)
    assert env["PLUGIN_DIR"] == "/var/lib/kubelet/plugins/gpu.nvidia.com"
    assert env["REGISTRAR_DIR"] == "/var/lib/kubelet/plugins_registry"
    assert env["PROC_ROOT"] == "/host/proc" and env["NVIDIA_DRIVER_ROOT"] == "/driver-root"


def test_driver_root_propagates_host_mounts_only_for_a_driver_container() -> None:
    # Found on the real cluster: with driverRoot "/" and HostToContainer, containerd refused the
    # plugin's container ("path / is mounted on / but it is not a shared or slave mount") on a host
    # whose / is private, and the plugin never started. A host install needs no propagation; the GPU
    # Operator's driver root (mounted after the pod starts) does.
    def mount(values: dict[str, Any]) -> dict[str, Any]:
        return next(m for m in _plugin_pod(values)["containers"][0]["volumeMounts"] if m["name"] == "driver-root")

    assert "mountPropagation" not in mount({})
    assert "mountPropagation" not in mount({"driverRoot": "/"})
    assert mount({"driverRoot": "/run/nvidia/driver"})["mountPropagation"] == "HostToContainer"


def test_simulated_nvml_gives_each_node_its_own_gpu_uuids() -> None:
    # Found on the real cluster: "sim:<profile>" alone gave every node the same UUIDs. The seed is
    # the node's name, expanded by the kubelet from NODE_NAME (defined earlier in the list).
    env_list = _plugin_pod({"nvml": {"source": "simulated", "simulatedProfile": "8xh100"}})["containers"][0]["env"]
    names = [e["name"] for e in env_list]
    assert _env({"env": env_list})["NVML"] == "sim:8xh100@$(NODE_NAME)"
    assert names.index("NODE_NAME") < names.index("NVML")
    fixed = _plugin_pod({"nvml": {"source": "simulated", "simulatedProfile": "8xh100@lab"}})["containers"][0]
    assert _env(fixed)["NVML"] == "sim:8xh100@lab"
    assert _env(_plugin_pod({})["containers"][0])["NVML"] == "real"


def test_the_testbed_fault_directory_is_mounted_only_when_set() -> None:
    pod = _plugin_pod({})
    assert "GPUREADY_SIM_CONTROL_DIR" not in _env(pod["containers"][0])
    assert not [v for v in pod["volumes"] if v["name"] == "sim-control"]
    pod = _plugin_pod({"testbed": {"simControlDir": "/tmp/faults"}})
    [volume] = [v for v in pod["volumes"] if v["name"] == "sim-control"]
    assert volume["hostPath"]["path"] == "/tmp/faults"
    [mount] = [m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "sim-control"]
    assert _env(pod["containers"][0])["GPUREADY_SIM_CONTROL_DIR"] == mount["mountPath"]


def test_daemonset_mounts_the_kubelets_pod_resources_directory_read_only(monkeypatch: pytest.MonkeyPatch) -> None:
    # Container names of allocated GPUs come from the kubelet's PodResources socket: the plugin sees
    # the directory (the kubelet re-creates the socket on restart) at the path it dials.
    pod = _plugin_pod({})
    volume = next(v for v in pod["volumes"] if v["name"] == "pod-resources")
    assert volume["hostPath"] == {"path": "/var/lib/kubelet/pod-resources", "type": "DirectoryOrCreate"}
    mount = next(m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "pod-resources")
    assert mount == {"name": "pod-resources", "mountPath": "/var/lib/kubelet/pod-resources", "readOnly": True}
    config = _plugin_config_from_chart({}, monkeypatch)
    assert config.pod_resources_socket == "/var/lib/kubelet/pod-resources/kubelet.sock"
    moved = {"kubeletPlugin": {"podResources": {"hostPath": "/data/kubelet/pod-resources/"}}}
    assert _plugin_config_from_chart(moved, monkeypatch).pod_resources_socket == "/data/kubelet/pod-resources/kubelet.sock"
    # Off: no mount, and the plugin is told not to ask (rather than look for a socket that is not there).
    off = {"kubeletPlugin": {"podResources": {"enabled": False}}}
    assert "pod-resources" not in {v["name"] for v in _plugin_pod(off)["volumes"]}
    assert _plugin_config_from_chart(off, monkeypatch).pod_resources_socket == ""


def test_daemonset_privileges_are_what_the_plugin_needs_and_no_more() -> None:
    pod = _plugin_pod({})
    for ns in ("hostNetwork", "hostPID", "hostIPC"):
        assert not pod.get(ns), f"plugin must not use {ns}"
    sc = pod["containers"][0]["securityContext"]
    assert sc["privileged"] is True and sc["readOnlyRootFilesystem"] is True
    assert pod["priorityClassName"] == "system-node-critical"


@pytest.mark.parametrize(("values", "propagation"), [
    ({}, "Bidirectional"),  # the per-claim tmpfs for MPS's /dev/shm reaches the host and the claim
    ({"kubeletPlugin": {"mpsMountPropagation": "None"}}, None),  # a host whose /run is private
    ({"kubeletPlugin": {"mpsShmSize": "0"}}, None),  # no tmpfs: nothing to propagate
    ({"kubeletPlugin": {"privileged": False}}, None),  # the API server refuses Bidirectional otherwise
])
def test_the_mps_root_propagates_the_plugins_mounts_only_when_it_mounts_them(
        values: dict[str, Any], propagation: str | None) -> None:
    mounts = {m["name"]: m for m in _plugin_pod(values)["containers"][0]["volumeMounts"]}
    assert mounts["mps"].get("mountPropagation") == propagation


def test_a_propagation_the_runtime_does_not_know_is_refused_at_install() -> None:
    with pytest.raises(Exception, match="mpsMountPropagation"):
        render({"kubeletPlugin": {"mpsMountPropagation": "Shared"}})


def test_daemonset_rolls_with_surge_and_per_pod_sockets() -> None:
    ds = one({}, "DaemonSet")
    assert ds["spec"]["updateStrategy"] == {"type": "RollingUpdate",
                                            "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    env = _env(ds["spec"]["template"]["spec"]["containers"][0])
    assert env["POD_UID"] == "fieldRef:metadata.uid"
    assert env["NODE_NAME"] == "fieldRef:spec.nodeName"


def test_daemonset_runs_only_on_gpu_nodes() -> None:
    pod = _plugin_pod({})
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    keys = {t["matchExpressions"][0]["key"] for t in terms}
    assert {"feature.node.kubernetes.io/pci-10de.present", "nvidia.com/gpu.present"} <= keys
    assert any(t["key"] == "nvidia.com/gpu" for t in pod["tolerations"])


def _plugin_config_from_chart(values: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> Any:
    """Run the real plugin's flag parsing with exactly the environment the chart gives its container."""
    import argparse

    from kubelet_plugin import plugin_command as command

    container = _plugin_pod(values)["containers"][0]
    downward = {"spec.nodeName": "gpu-node-7", "metadata.uid": "3f1b2c4d-5e6f-4a1b-9c2d-0123456789ab",
                "metadata.name": "gpuready-kubelet-plugin-x", "metadata.namespace": NAMESPACE}
    seen: dict[str, str] = {}
    for name, value in _env(container).items():
        value = downward[value[9:]] if value.startswith("fieldRef:") else value
        # The kubelet expands $(NAME) from variables defined earlier in the list.
        value = re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: seen.get(m[1], m[0]), value)
        seen[name] = value
        monkeypatch.setenv(name, value)
    assert container["args"][-1] == "kubelet-plugin"
    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    return command.config_from_args(parser.parse_args([]))


@pytest.mark.parametrize("values_name", sorted(VALUE_SETS))
def test_the_plugin_accepts_the_configuration_the_chart_gives_it(values_name: str,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    values = VALUE_SETS[values_name]
    config = _plugin_config_from_chart(values, monkeypatch)  # raises ValueError naming a bad flag
    assert config.node_name == "gpu-node-7"
    assert config.pod_uid == "3f1b2c4d-5e6f-4a1b-9c2d-0123456789ab"
    assert config.driver_name == values.get("driverName", "gpu.nvidia.com")
    assert config.plugin_data_dir == f"/var/lib/kubelet/plugins/{config.driver_name}"
    assert config.metrics_port == 8080


def test_the_plugin_parses_the_xid_lists_the_chart_writes(monkeypatch: pytest.MonkeyPatch) -> None:
    # The schema's extremes (1 and 1023), joined by the template, through the plugin's one XID parser.
    config = _plugin_config_from_chart({"xid": {"ignore": [1, 1023], "fatal": [79]}}, monkeypatch)
    assert (config.xid_ignore, config.xid_fatal) == ({1, 1023}, {79})


def test_daemon_options_reach_the_plugin(monkeypatch: pytest.MonkeyPatch) -> None:
    config = _plugin_config_from_chart(VALUE_SETS["dynamic-taint-shared"], monkeypatch)
    assert (config.mig_mode, config.health_mode, config.shared_gpus) == ("dynamic", "taint", True)
    env = _env(_plugin_pod(VALUE_SETS["dynamic-taint-shared"])["containers"][0])
    assert (env["XID_IGNORE"], env["XID_FATAL"]) == ("13,31", "43")
    if hasattr(config, "recovery_passes"):  # the plugin's health options (flags with env fallbacks)
        from kubelet_plugin.health.policy import policy_from_config

        policy = policy_from_config(config)
        assert policy.extra_ignored_xids == {13, 31} and policy.extra_fatal_xids == {43}
        assert (policy.required_passes, policy.hold_down_s, policy.probe_timeout_s) == (3, 300, 30)
    if hasattr(config, "host_driver_root"):
        assert (config.driver_root, config.host_driver_root) == ("/driver-root", "/")
    listed = _plugin_config_from_chart(VALUE_SETS["no-controller"], monkeypatch)
    assert listed.shared_gpus == frozenset({"gpu-0", "gpu-2"})
    sim = _plugin_pod(VALUE_SETS["simulated-evict"])
    assert _plugin_config_from_chart(VALUE_SETS["simulated-evict"], monkeypatch).nvml == "sim:8xh100@gpu-node-7"
    assert sim["containers"][0]["args"][0] == "--log-level=debug"
    assert "PROC_ROOT" not in _env(sim["containers"][0])
    assert "host-proc" not in {v["name"] for v in sim["volumes"]}


def test_share_modes_reach_the_plugin(monkeypatch: pytest.MonkeyPatch) -> None:
    # A number unquoted in YAML reaches the plugin as digits (Helm reads it as a float: not "1e+06").
    config = _plugin_config_from_chart(VALUE_SETS["shares"], monkeypatch)
    assert (config.shared_gpus, config.share_mode) == (True, "1000000")
    assert config.gpu_share_modes == (("gpu-0", "4"), ("gpu-1", "unlimited"))
    config = _plugin_config_from_chart({}, monkeypatch)
    assert (config.share_mode, config.gpu_share_modes) == ("memory", ())


def test_vram_accounting_settings_reach_the_plugin(monkeypatch: pytest.MonkeyPatch) -> None:
    config = _plugin_config_from_chart({}, monkeypatch)
    assert (config.proc_root, config.vram_interval) == ("/host/proc", 15)
    config = _plugin_config_from_chart({"kubeletPlugin": {"vramCheckIntervalSeconds": 60}}, monkeypatch)
    assert config.vram_interval == 60
    # Without the host's /proc mounted nothing maps to a pod: no periodic check (and no Events) then.
    config = _plugin_config_from_chart(VALUE_SETS["simulated-evict"], monkeypatch)
    assert config.vram_interval == 0


# --- controller and webhooks ------------------------------------------------------------------------

def test_controller_is_two_replicas_with_leader_election_and_least_privilege() -> None:
    dep = one({}, "Deployment")
    assert dep["spec"]["replicas"] == 2
    pod = dep["spec"]["template"]["spec"]
    env = _env(pod["containers"][0])
    assert env["LEADER_ELECT"] == "true" and env["LEADER_ELECTION_NAMESPACE"] == "fieldRef:metadata.namespace"
    assert env["WEBHOOK_CERT_DIR"] == "/etc/gpuready/webhook-tls"
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["containers"][0]["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert one({}, "PodDisruptionBudget")["spec"]["minAvailable"] == 1
    assert find(VALUE_SETS["simulated-evict"], "PodDisruptionBudget") == []


def test_webhooks_shape_claims_leniently_and_validate_strictly() -> None:
    mutating = one({}, "MutatingWebhookConfiguration")["webhooks"][0]
    validating = one({}, "ValidatingWebhookConfiguration")["webhooks"][0]
    assert mutating["failurePolicy"] == "Ignore" and validating["failurePolicy"] == "Fail"
    for hook in (mutating, validating):
        assert hook["rules"][0]["resources"] == ["resourceclaims", "resourceclaimtemplates"]
        assert hook["rules"][0]["apiGroups"] == ["resource.k8s.io"]
        assert hook["clientConfig"]["service"]["namespace"] == NAMESPACE
        assert hook["sideEffects"] == "None"
    assert mutating["clientConfig"]["service"]["path"] == "/mutate"
    assert validating["clientConfig"]["service"]["path"] == "/validate"
    # DeviceClasses with opaque config are validated too, except the chart's own (installed before the
    # controller can answer: a Fail policy on them would fail the install).
    classes_hook = one({}, "ValidatingWebhookConfiguration")["webhooks"][1]
    assert classes_hook["rules"][0]["resources"] == ["deviceclasses"] and classes_hook["failurePolicy"] == "Fail"
    expr = classes_hook["objectSelector"]["matchExpressions"][0]
    assert (expr["key"], expr["operator"], expr["values"]) == ("app.kubernetes.io/instance", "NotIn", [RELEASE])
    for cls in find({}, "DeviceClass"):
        assert cls["metadata"]["labels"]["app.kubernetes.io/instance"] == RELEASE


def test_generated_webhook_certificate_is_signed_by_the_bundled_ca_for_the_service_name() -> None:
    x509 = pytest.importorskip("cryptography.x509")
    secret = one({}, "Secret")
    ca = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["ca.crt"]))
    cert = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["tls.crt"]))
    cert.verify_directly_issued_by(ca)  # raises if the CA did not sign it
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName)
    service = one({}, "Service", "webhook")["metadata"]["name"]
    assert f"{service}.{NAMESPACE}.svc" in sans
    assert cert.not_valid_after_utc > datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=365)
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        assert one({}, kind)["webhooks"][0]["clientConfig"]["caBundle"] == secret["data"]["ca.crt"]
    mount = one({}, "Deployment")["spec"]["template"]["spec"]["volumes"][0]["secret"]["secretName"]
    assert mount == secret["metadata"]["name"]


def test_cert_manager_option_replaces_the_generated_secret() -> None:
    values = VALUE_SETS["cert-manager"]
    assert find(values, "Secret") == []
    cert = one(values, "Certificate")
    assert cert["spec"]["issuerRef"]["name"] == one(values, "Issuer")["metadata"]["name"]
    hook = one(values, "ValidatingWebhookConfiguration")
    assert hook["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == f"{NAMESPACE}/{cert['metadata']['name']}"
    assert "caBundle" not in hook["webhooks"][0]["clientConfig"]
    corp = VALUE_SETS["cert-manager-issuer"]
    assert find(corp, "Issuer") == []
    assert one(corp, "Certificate")["spec"]["issuerRef"] == {"name": "corp-ca", "kind": "ClusterIssuer"}


def test_no_controller_means_no_webhook() -> None:
    values = VALUE_SETS["no-controller"]
    kinds = {o["kind"] for o in objects(values)}
    assert not kinds & {"Deployment", "MutatingWebhookConfiguration", "ValidatingWebhookConfiguration", "Secret"}
    assert {"DaemonSet", "DeviceClass", "ValidatingAdmissionPolicy"} <= kinds


# --- device classes ---------------------------------------------------------------------------------

def _cel_matches(expression: str, device: dict[str, Any]) -> bool:
    import celpy

    env = celpy.Environment()
    return bool(env.program(env.compile(expression)).evaluate({"device": celpy.json_to_cel(device)}))


@pytest.mark.parametrize("values_name,driver,names", [
    ("default", "gpu.nvidia.com", ("gpu.nvidia.com", "mig.nvidia.com", "vram.gpu.nvidia.com")),
    ("custom-driver", "gpu.example.com", ("gpu.example.com", "mig.example.com", "vram.gpu.example.com")),
])
def test_device_classes_select_this_drivers_devices(values_name: str, driver: str, names: tuple[str, ...]) -> None:
    classes = {c["metadata"]["name"]: c for c in find(VALUE_SETS[values_name], "DeviceClass")}
    assert set(classes) == set(names)
    gpu_class, mig_class, vram_class = names

    def expr(name: str) -> str:
        value: str = classes[name]["spec"]["selectors"][0]["cel"]["expression"]
        return value

    def dev(drv: str, typ: str, memory: bool = True) -> dict[str, Any]:
        return {"driver": drv, "attributes": {drv: {"type": typ}},
                "capacity": {drv: {"memory": 85899345920}} if memory else {drv: {}}}

    assert _cel_matches(expr(gpu_class), dev(driver, "gpu")) and not _cel_matches(expr(gpu_class), dev(driver, "mig"))
    assert _cel_matches(expr(mig_class), dev(driver, "mig")) and not _cel_matches(expr(mig_class), dev(driver, "gpu"))
    assert _cel_matches(expr(vram_class), dev(driver, "gpu")) and _cel_matches(expr(vram_class), dev(driver, "mig"))
    assert not _cel_matches(expr(vram_class), dev(driver, "gpu", memory=False))
    for name in names:
        assert not _cel_matches(expr(name), dev("other.example.com", "gpu"))
    if values_name == "custom-driver":
        assert classes[gpu_class]["spec"]["extendedResourceName"] == "example.com/gpu"
        assert "nvidia" not in json.dumps([c["spec"] for c in classes.values()])


def test_defaults_map_nvidia_gpu_to_the_gpu_class_and_warn_on_timeslice_intervals() -> None:
    # A pod asking nvidia.com/gpu: 1 gets a DRA GPU on a default install, as with NVIDIA's chart.
    classes = {c["metadata"]["name"]: c for c in objects({}) if c["kind"] == "DeviceClass"}
    assert classes["gpu.nvidia.com"]["spec"]["extendedResourceName"] == "nvidia.com/gpu"
    assert "extendedResourceName" not in classes["mig.nvidia.com"]["spec"]
    assert "extendedResourceName" not in classes["vram.gpu.nvidia.com"]["spec"]
    off = {c["metadata"]["name"]: c for c in objects({"deviceClasses": {"extendedResourceName": ""}})
           if c["kind"] == "DeviceClass"}
    assert "extendedResourceName" not in off["gpu.nvidia.com"]["spec"]
    controller = next(o for o in objects({}) if o["kind"] == "Deployment")
    env = {e["name"]: e.get("value") for e in controller["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["TIMESLICE_INTERVAL"] == "ignore"


def test_chart_device_classes_are_the_ones_in_deploy_deviceclasses() -> None:
    # One definition: the chart reads deploy/deviceclasses through a link, so kubectl users and Helm
    # users get the same classes.
    shipped = {}
    for path in sorted((CHART.parent.parent / "deviceclasses").glob("*.yaml")):
        obj = yaml.safe_load(path.read_text())
        shipped[obj["metadata"]["name"]] = obj["spec"]
    rendered = {c["metadata"]["name"]: c["spec"] for c in find({"deviceClasses": {"extendedResourceName": ""}},
                                                                 "DeviceClass")}
    assert shipped and rendered == shipped  # the chart adds only its extendedResourceName value (default on)
    # The controller shapes requests of the vram class the chart created.
    env = _env(one({}, "Deployment")["spec"]["template"]["spec"]["containers"][0])
    assert env["MEMORY_DEVICE_CLASS"] in rendered


# --- monitoring -------------------------------------------------------------------------------------

def test_prometheus_operator_objects_only_when_the_cluster_serves_them() -> None:
    # Offline the engine reports no monitoring.coreos.com/v1: "auto" renders nothing and says why.
    assert not {"PodMonitor", "ServiceMonitor", "PrometheusRule"} & {o["kind"] for o in objects({})}
    notes = next(t for p, t in render({}).items() if p.endswith("NOTES.txt"))
    assert "Prometheus Operator is not installed" in notes
    values = VALUE_SETS["monitoring"]
    pm = one(values, "PodMonitor")
    assert pm["metadata"]["labels"]["release"] == "kps"
    assert pm["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"] == "kubelet-plugin"
    assert pm["spec"]["podMetricsEndpoints"][0]["port"] == "metrics"
    ds_ports = _plugin_pod(values)["containers"][0]["ports"]
    assert any(p["name"] == "metrics" for p in ds_ports)
    assert one(values, "ServiceMonitor")["spec"]["endpoints"][0]["port"] == "metrics"


def _exported_families() -> set[str]:
    from prometheus_client import CollectorRegistry

    from controller.controller_metrics import ControllerMetrics
    from kubelet_plugin.metrics import PluginMetrics
    from kubelet_plugin.metrics.gpu_collector import FAMILIES

    names = set(FAMILIES)
    registries = (PluginMetrics(CollectorRegistry(), node="n").registry, ControllerMetrics().registry)
    for metric in (m for registry in registries for m in registry.collect()):
        names.update(s.name for s in metric.samples)
        names.add(metric.name)
        if metric.type == "counter":
            names.add(metric.name + "_total")
        if metric.type == "histogram":
            names.update(metric.name + suffix for suffix in ("_bucket", "_sum", "_count"))
    names.update({"gpuready_claim_vram_used_bytes", "gpuready_claim_vram_requested_bytes"})
    return names


def _metric_names(expr: str) -> set[str]:
    return set(re.findall(r"\b((?:gpuready|DCGM)_[A-Za-z0-9_]+)", expr))


def test_alerts_cover_the_promised_conditions_and_use_exported_metrics() -> None:
    rule = one(VALUE_SETS["monitoring"], "PrometheusRule")
    alerts = {r["alert"]: r for r in rule["spec"]["groups"][0]["rules"]}
    assert {"GPUNotReady", "GPUXIDStorm", "GPUValidationFailing", "GPUPrepareErrors"} <= set(alerts)
    exported = _exported_families()
    for name, alert in alerts.items():
        used = _metric_names(alert["expr"])
        assert used and used <= exported, f"{name} uses metrics nobody exports: {used - exported}"
        assert "{{ $labels." in alert["annotations"]["summary"]  # Helm left Prometheus' templating alone


def test_grafana_dashboard_is_valid_json_over_exported_metrics() -> None:
    cm = one({}, "ConfigMap", "dashboard")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    dash = json.loads(cm["data"]["gpuready.json"])
    exported = _exported_families()
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    assert len(exprs) >= 10
    for expr in exprs:
        assert _metric_names(expr) <= exported, expr


# --- schema -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("bad,field", [
    ({"migMode": "auto"}, "/migMode"),
    ({"healthMode": "drain"}, "/healthMode"),
    ({"driverName": "GPU_NVIDIA"}, "/driverName"),
    ({"xid": {"ignore": ["79"]}}, "/xid/ignore/0"),
    # What the plugin's XID parser refuses, the chart refuses first, naming the value.
    ({"xid": {"fatal": [0]}}, "/xid/fatal/0"),
    ({"xid": {"ignore": [-5]}}, "/xid/ignore/0"),
    ({"xid": {"fatal": [13, 13]}}, "/xid/fatal"),
    ({"driverNmae": "gpu.nvidia.com"}, "driverNmae"),
    ({"monitoring": {"serviceMonitor": {"enabled": "yes"}}}, "/monitoring/serviceMonitor/enabled"),
    ({"kubeletPlugin": {"metrics": {"port": 70000}}}, "/kubeletPlugin/metrics/port"),
    ({"nvml": {"source": "fake"}}, "/nvml/source"),
    ({"controller": {"placementPolicy": "random"}}, "/controller/placementPolicy"),
    ({"driverRoot": "run/nvidia/driver"}, "/driverRoot"),
    ({"sharedGpus": ["0"]}, "/sharedGpus/0"),
    ({"shareMode": "shares"}, "/shareMode"),
    ({"shareMode": 0}, "/shareMode"),
    ({"gpuShareModes": {"gpu-0": "4x"}}, "/gpuShareModes/gpu-0"),
    ({"gpuShareModes": {"GPU-0": "4"}}, "/gpuShareModes"),
    ({"migMode": "off"}, "/migMode"),
    ({"kubeletPlugin": {"vramCheckIntervalSeconds": -1}}, "/kubeletPlugin/vramCheckIntervalSeconds"),
    ({"kubeletPlugin": {"podResources": {"hostPath": "var/lib/kubelet/pod-resources"}}},
     "/kubeletPlugin/podResources/hostPath"),
    ({"kubeletPlugin": {"podResources": {"enabled": "yes"}}}, "/kubeletPlugin/podResources/enabled"),
    ({"timeSliceInterval": "Long"}, "/timeSliceInterval"),
])
def test_schema_rejects_wrong_values_naming_the_field(bad: dict[str, Any], field: str) -> None:
    with pytest.raises(helm.HelmValuesError) as info:
        _chart().render(bad, name=RELEASE, namespace=NAMESPACE)
    assert field in str(info.value)


@pytest.mark.parametrize("bad,message", [
    ({"xid": {"ignore": [13, 79], "fatal": [79]}}, "xid.ignore and xid.fatal both list XID(s) [79]"),
    ({"controller": {"leaderElection": {"enabled": False}}}, "enable leader election or set replicas to 1"),
    ({"controller": {"leaderElection": {"leaseDurationSeconds": 5, "renewDeadlineSeconds": 10}}},
     "leaseDurationSeconds (5) must be greater than renewDeadlineSeconds (10)"),
    ({"controller": {"healthPort": 8080}}, "controller.healthPort and controller.metrics.port are both 8080"),
    ({"webhook": {"port": 8081}}, "controller.healthPort and webhook.port are both 8081"),
    # The plugin cannot change a GPU's time slice yet: "apply" would silently not apply.
    ({"timeSliceInterval": "apply"}, "set timeSliceInterval: ignore"),
])
def test_contradictory_values_fail_with_a_message_naming_them(bad: dict[str, Any], message: str) -> None:
    with pytest.raises(helm.HelmRenderError) as info:
        _chart().render(bad, name=RELEASE, namespace=NAMESPACE)
    assert message in str(info.value)


# --- install guard against another driver of the same name ------------------------------------------

@pytest.fixture(scope="module")
def apiserver() -> Any:
    from testbed.apiserver import LocalApiServer

    with LocalApiServer() as srv:
        yield srv


def _cluster_render(srv: Any, values: dict[str, Any], *, install: bool = True) -> dict[str, str]:
    kubeconfig = srv.write_kubeconfig(tempfile.mktemp(prefix="kc-", dir="/tmp"))
    cfg = helm.Config(kubeconfig_path=kubeconfig, namespace=NAMESPACE)
    try:
        out: dict[str, str] = cfg.render(_chart(), values, name=RELEASE, namespace=NAMESPACE,
                                         is_install=install, is_upgrade=not install)
        return out
    finally:
        Path(kubeconfig).unlink(missing_ok=True)
        cfg.close()


def test_install_fails_beside_another_driver_of_the_same_name(apiserver: Any) -> None:
    import kubernetes

    api = kubernetes.client.ResourceV1Api(apiserver.api_client())
    assert "gpuready/templates/kubelet-plugin-daemonset.yaml" in _cluster_render(apiserver, {})
    # Another installation's DeviceClass of the same name: the install must refuse, naming it.
    api.create_device_class({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
                             "metadata": {"name": "mig.nvidia.com",
                                          "annotations": {"meta.helm.sh/release-name": "nvidia-dra"}},
                             "spec": {}})
    try:
        with pytest.raises(helm.HelmRenderError, match=r'DeviceClass "mig.nvidia.com" already exists'):
            _cluster_render(apiserver, {})
        # A different driver name does not collide.
        _cluster_render(apiserver, {"driverName": "gpu.gpuready.io"})
    finally:
        api.delete_device_class("mig.nvidia.com")
    # Our own release's class (an upgrade) is fine.
    api.create_device_class({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
                             "metadata": {"name": "gpu.nvidia.com", "annotations": {
                                 "meta.helm.sh/release-name": RELEASE,
                                 "meta.helm.sh/release-namespace": NAMESPACE}}, "spec": {}})
    try:
        _cluster_render(apiserver, {}, install=False)
    finally:
        api.delete_device_class("gpu.nvidia.com")


def test_install_fails_when_another_driver_already_publishes_slices(apiserver: Any) -> None:
    import kubernetes

    core = kubernetes.client.CoreV1Api(apiserver.api_client())
    api = kubernetes.client.ResourceV1Api(apiserver.api_client())
    core.create_node({"metadata": {"name": "gpu-node-1"}})
    api.create_resource_slice({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": "gpu-node-1-x"},
        "spec": {"driver": "gpu.nvidia.com", "nodeName": "gpu-node-1",
                 "pool": {"name": "gpu-node-1", "generation": 1, "resourceSliceCount": 1}, "devices": []}})
    with pytest.raises(helm.HelmRenderError, match=r"ResourceSlice \"gpu-node-1-x\" of driver gpu.nvidia.com"):
        _cluster_render(apiserver, {})
    _cluster_render(apiserver, {}, install=False)  # an upgrade of our own release: its slices are ours
    _cluster_render(apiserver, {"conflictCheck": {"enabled": False}})
    api.delete_resource_slice("gpu-node-1-x")


def _selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def test_services_and_monitors_reach_the_pods_and_ports_they_name() -> None:
    values = VALUE_SETS["monitoring"]
    plugin_tpl = one(values, "DaemonSet")["spec"]["template"]
    ctrl_tpl = one(values, "Deployment")["spec"]["template"]
    ctrl_ports = {p["name"] for p in ctrl_tpl["spec"]["containers"][0]["ports"]}
    plugin_ports = {p["name"] for p in plugin_tpl["spec"]["containers"][0]["ports"]}
    # Workload selectors match their own pod templates, and never the other component's.
    for workload, tpl, other in ((one(values, "DaemonSet"), plugin_tpl, ctrl_tpl),
                                 (one(values, "Deployment"), ctrl_tpl, plugin_tpl)):
        selector = workload["spec"]["selector"]["matchLabels"]
        assert _selects(selector, tpl["metadata"]["labels"]) and not _selects(selector, other["metadata"]["labels"])
    pm = one(values, "PodMonitor")["spec"]
    assert _selects(pm["selector"]["matchLabels"], plugin_tpl["metadata"]["labels"])
    assert not _selects(pm["selector"]["matchLabels"], ctrl_tpl["metadata"]["labels"])
    assert pm["podMetricsEndpoints"][0]["port"] in plugin_ports
    services = {s["metadata"]["name"]: s for s in find(values, "Service")}
    for svc in services.values():
        assert _selects(svc["spec"]["selector"], ctrl_tpl["metadata"]["labels"])
        for port in svc["spec"]["ports"]:
            assert port["targetPort"] in ctrl_ports
    sm = one(values, "ServiceMonitor")["spec"]
    monitored = [s for s in services.values() if _selects(sm["selector"]["matchLabels"], s["metadata"]["labels"])]
    assert any(sm["endpoints"][0]["port"] in {p["name"] for p in s["spec"]["ports"]} for s in monitored)
    hook_service = one(values, "MutatingWebhookConfiguration")["webhooks"][0]["clientConfig"]["service"]
    assert hook_service["name"] in services
    assert hook_service["port"] in {p["port"] for p in services[hook_service["name"]]["spec"]["ports"]}
    # The controller's Lease RBAC names the Lease the controller is told to use.
    lease_env = _env(ctrl_tpl["spec"]["containers"][0])["LEADER_ELECTION_LEASE_NAME"]
    role = next(r for r in find(values, "Role") if "leader-election" in r["metadata"]["name"])
    assert any(lease_env in rule.get("resourceNames", []) for rule in role["rules"])


# Environment variables the chart sets that the daemon does not read by design (read elsewhere or by
# libraries), and ones whose reader has not landed yet.
_NOT_DAEMON_OPTIONS = {"POD_NAME", "POD_NAMESPACE", "GPUREADY_LOG_FORMAT", "NVIDIA_VISIBLE_DEVICES",
                       "CUDA_CACHE_PATH"}
_PLUGIN_PENDING: set[str] = set()  # every chart setting is read (PROC_ROOT: VRAM accounting)


@pytest.mark.parametrize("module_name,kind,pending", [
    ("kubelet_plugin.plugin_command", "DaemonSet", _PLUGIN_PENDING),
    ("controller.controller_command", "Deployment", set()),
])
def test_every_option_the_chart_sets_is_read_by_the_daemon(module_name: str, kind: str, pending: set[str]) -> None:
    import inspect

    module = pytest.importorskip(module_name)
    source = inspect.getsource(module)
    for values_name in ("default", "simulated-evict"):
        container = one(VALUE_SETS[values_name], kind)["spec"]["template"]["spec"]["containers"][0]
        unread = {name for name in _env(container)
                  if name not in _NOT_DAEMON_OPTIONS | pending and f'"{name}"' not in source}
        assert not unread, f"the chart sets {sorted(unread)} but {module_name} never reads them"


@pytest.mark.parametrize("values_name", ["default", "simulated-evict", "custom-driver"])
def test_the_controller_accepts_the_configuration_the_chart_gives_it(values_name: str,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    import argparse

    command = pytest.importorskip("controller.controller_command")
    values = VALUE_SETS[values_name]
    container = one(values, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    downward = {"metadata.name": "gpuready-controller-abc", "metadata.namespace": NAMESPACE}
    seen: dict[str, str] = {}
    for name, value in _env(container).items():
        value = downward[value[9:]] if value.startswith("fieldRef:") else value
        # The kubelet expands $(NAME) from variables defined earlier in the list.
        value = re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: seen.get(m[1], m[0]), value)
        seen[name] = value
        monkeypatch.setenv(name, value)
    assert container["args"][-1] == "controller"
    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    config = command.config_from_args(parser.parse_args([]))  # ValueError names a bad flag
    driver = values.get("driverName", "gpu.nvidia.com")
    assert config.driver_name == driver and config.memory_class == f"vram.{driver}"
    assert (config.lease_namespace, config.lease_name) == (NAMESPACE, "gpuready-controller")
    assert config.leader_elect is True
    assert config.on_device_failure == values.get("controller", {}).get("unhealthyClaimPolicy", "none")
    mount = next(m["mountPath"] for m in container["volumeMounts"] if m["name"] == "webhook-tls")
    assert (config.cert_file, config.key_file) == (f"{mount}/tls.crt", f"{mount}/tls.key")
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert (config.webhook_port, config.metrics_port, config.health_port) == (
        ports["webhook"], ports["metrics"], ports["health"])


# Options a daemon reads that the chart deliberately leaves to their defaults: the kubeconfig (in a
# cluster the service account is used), and the webhook's single-file TLS paths (the chart mounts a
# directory, WEBHOOK_CERT_DIR, instead).
# KUBELET_*_DIRECTORY_PATH: the upstream helper's names, accepted for other drivers' manifests; the
# chart sets the plugin's own (REGISTRAR_DIR, PLUGIN_DIR).
_NOT_FOR_THE_CHART = {"KUBECONFIG", "WEBHOOK_CERT", "WEBHOOK_KEY", "KUBELET_REGISTRAR_DIRECTORY_PATH",
                      "KUBELET_PLUGINS_DIRECTORY_PATH"}


@pytest.mark.parametrize("module_name,kind", [("kubelet_plugin.plugin_command", "DaemonSet"),
                                              ("controller.controller_command", "Deployment")])
def test_every_option_the_daemon_reads_has_a_chart_setting(module_name: str, kind: str) -> None:
    """values.yaml promises every daemon option: an option added without a chart value fails here."""
    import inspect
    import re

    source = inspect.getsource(pytest.importorskip(module_name))
    read = set(re.findall(r'(?:_env|environ\.get)\("([A-Z][A-Z0-9_]+)"', source))
    assert read, f"no environment options found in {module_name}: the pattern is out of date"
    container = one(VALUE_SETS["default"], kind)["spec"]["template"]["spec"]["containers"][0]
    missing = read - set(_env(container)) - _NOT_FOR_THE_CHART
    assert not missing, f"{module_name} reads {sorted(missing)} but the chart never sets them"


def test_ipv6_and_resync_settings_reach_the_controller_and_the_plugin() -> None:
    values = {"controller": {"bindAddress": "::", "resyncSeconds": 12},
              "kubeletPlugin": {"healthStreamResendSeconds": 7, "devRoot": "off"}}
    ctrl = _env(one(values, "Deployment")["spec"]["template"]["spec"]["containers"][0])
    assert (ctrl["BIND_ADDRESS"], ctrl["RESYNC_SECONDS"]) == ("::", "12")
    plugin = _env(one(values, "DaemonSet")["spec"]["template"]["spec"]["containers"][0])
    assert (plugin["HEALTH_INTERVAL"], plugin["DEV_ROOT"]) == ("7", "off")


@pytest.mark.parametrize("value,mode", [(None, "off"), ("off", "off"), (False, "off"), ("gated", "gated")])
def test_placement_mode_reaches_the_controller(value: Any, mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import argparse

    from controller import controller_command as command

    values: dict[str, Any] = {} if value is None else {"controller": {"placementMode": value}}
    env = _env(one(values, "Deployment")["spec"]["template"]["spec"]["containers"][0])
    assert env["PLACEMENT_MODE"] == mode  # an unquoted `off` in a values file (YAML false) is off too
    monkeypatch.setenv("PLACEMENT_MODE", env["PLACEMENT_MODE"])
    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    assert command.config_from_args(parser.parse_args([])).placement_mode == mode


def test_placement_mode_is_checked_by_the_schema_and_needs_the_controller() -> None:
    with pytest.raises(helm.HelmValuesError) as info:
        _chart().render({"controller": {"placementMode": "on"}}, name=RELEASE, namespace=NAMESPACE)
    assert "/controller/placementMode" in str(info.value)
    with pytest.raises(helm.HelmRenderError) as err:
        _chart().render({"controller": {"enabled": False, "placementMode": "gated"}}, name=RELEASE,
                        namespace=NAMESPACE)
    assert "controller.placementMode is gated but controller.enabled is false" in str(err.value)


@pytest.mark.parametrize("values_name", ["default", "health-off", "simulated-evict"])
def test_plugin_probes_its_own_healthz_and_readyz_on_the_metrics_port(values_name: str) -> None:
    values = VALUE_SETS[values_name]
    container = _plugin_pod(values)["containers"][0]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["metrics"] == 8080 and _env(container)["METRICS_PORT"] == "8080"
    startup, liveness, readiness = (container[k] for k in ("startupProbe", "livenessProbe", "readinessProbe"))
    # Liveness: the plugin's DRA socket and loops (never /metrics, which reads NVML per GPU).
    assert liveness["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert (liveness["periodSeconds"], liveness["failureThreshold"], liveness["timeoutSeconds"]) == (10, 3, 3)
    # A slow NVML start on a big node gets 150 s before liveness can restart it.
    assert startup["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 150
    assert readiness["httpGet"] == {"path": "/readyz", "port": "metrics"}
    # The probe's own gRPC deadline (kubelet_plugin.liveness) fits inside the kubelet's timeout.
    from kubelet_plugin.liveness import DEFAULT_TIMEOUT_S

    assert all(p["timeoutSeconds"] > DEFAULT_TIMEOUT_S for p in (startup, liveness, readiness))


def test_plugin_probes_follow_a_custom_metrics_port_and_port_zero_is_refused() -> None:
    container = _plugin_pod({"kubeletPlugin": {"metrics": {"port": 9400}}})["containers"][0]
    assert {p["name"]: p["containerPort"] for p in container["ports"]}["metrics"] == 9400
    assert _env(container)["METRICS_PORT"] == "9400"
    assert {container[k]["httpGet"]["port"] for k in ("startupProbe", "livenessProbe", "readinessProbe")} == {"metrics"}
    # Port 0 would turn the plugin's HTTP server (and with it the probes) off: the schema refuses it.
    with pytest.raises(helm.HelmValuesError) as info:
        _chart().render({"kubeletPlugin": {"metrics": {"port": 0}}}, name=RELEASE, namespace=NAMESPACE)
    assert "/kubeletPlugin/metrics/port" in str(info.value)


def test_bind_time_validation_reaches_the_plugin_with_the_grants_it_needs(monkeypatch: pytest.MonkeyPatch) -> None:
    on = {"kubeletPlugin": {"bindTimeValidation": {"enabled": True, "freshnessSeconds": 5}}}
    config = _plugin_config_from_chart(on, monkeypatch)
    assert (config.bind_time_validation, config.bind_validation_freshness) == (True, 5.0)
    assert _plugin_config_from_chart({}, monkeypatch).bind_time_validation is False

    def plugin_rules(values: dict[str, Any]) -> list[tuple[str, tuple[str, ...], tuple[str, ...]]]:
        [role] = [o for o in find(values, "ClusterRole", "kubelet-plugin")]
        return [(r, tuple(rule.get("resourceNames") or ()), tuple(rule["verbs"]))
                for rule in role["rules"] for r in rule["resources"]]

    granted = plugin_rules(on)
    assert ("resourceclaims", (), ("list", "watch")) in granted  # the watch of claims awaiting this node
    assert ("resourceclaims/status", (), ("update",)) in granted
    assert ("resourceclaims/driver", ("gpu.nvidia.com",), ("associated-node:update",)) in granted
    default = plugin_rules({})
    assert not [g for g in default if g[0] in ("resourceclaims/status", "resourceclaims/driver")
                or (g[0] == "resourceclaims" and "watch" in g[2])], default
