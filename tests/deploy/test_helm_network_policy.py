"""The chart's NetworkPolicies let in only what the daemons need (the API server to the webhook,
scrapers to /metrics; the kubelet's probes come from the node, which a policy always admits), and
each endpoint's bind address reaches the controller."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

pytest.importorskip("helm_python")
import helm_python as helm
from test_helm_chart import NAMESPACE, RELEASE, _chart, _env, find, one

PROMETHEUS = ({"app.kubernetes.io/name": "prometheus"}, {"kubernetes.io/metadata.name": "monitoring"})
TENANT = ({"app": "notebook"}, {"kubernetes.io/metadata.name": "team-a"})


def _matches(selector: dict[str, Any] | None, labels: dict[str, str]) -> bool:
    if selector is None:
        return True
    assert set(selector) <= {"matchLabels"}, "the evaluator below knows matchLabels only"
    return all(labels.get(k) == v for k, v in (selector.get("matchLabels") or {}).items())


def admits(policy: dict[str, Any], port: int, pod: tuple[dict[str, str], dict[str, str]] | str) -> bool:
    """Whether ``policy`` lets ``pod`` (its labels, its namespace's labels; or an IP) reach ``port``,
    by the NetworkPolicy rules: any rule whose ports include it and whose peers (none: everyone) match."""
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    for rule in policy["spec"].get("ingress") or []:
        if port not in [p["port"] for p in rule.get("ports") or []]:
            continue
        peers = rule.get("from")
        if not peers:
            return True
        for peer in peers:
            if isinstance(pod, str):
                if "ipBlock" in peer and pod.startswith(peer["ipBlock"]["cidr"].split("/")[0].rsplit(".", 1)[0]):
                    return True
                continue
            if "ipBlock" in peer:
                continue
            pod_labels, ns_labels = pod
            if "namespaceSelector" not in peer and ns_labels.get("kubernetes.io/metadata.name") != NAMESPACE:
                continue  # a podSelector alone means the policy's own namespace
            if _matches(peer.get("podSelector"), pod_labels) and _matches(peer.get("namespaceSelector"), ns_labels):
                return True
    return False


def test_by_default_only_prometheus_scrapes_and_anyone_may_call_the_webhook_port_only() -> None:
    plugin = one({}, "NetworkPolicy", "kubelet-plugin")
    controller = one({}, "NetworkPolicy", "controller")
    assert plugin["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "kubelet-plugin"
    assert controller["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "controller"
    assert admits(plugin, 8080, PROMETHEUS) and not admits(plugin, 8080, TENANT)
    assert admits(controller, 8080, PROMETHEUS) and not admits(controller, 8080, TENANT)
    assert admits(controller, 8443, TENANT)  # the API server is no pod: the webhook port is open, alone
    for port in (8081, 9999):  # the probes (node-local, always admitted) and anything else
        assert not admits(controller, port, TENANT) and not admits(controller, port, PROMETHEUS)


def test_the_webhook_can_be_narrowed_to_the_control_plane_and_scraping_closed() -> None:
    values = {"networkPolicy": {"metricsFrom": [], "webhookFrom": [{"ipBlock": {"cidr": "10.0.0.0/24"}}]}}
    plugin = one(values, "NetworkPolicy", "kubelet-plugin")
    controller = one(values, "NetworkPolicy", "controller")
    assert plugin["spec"]["ingress"] == []  # an empty rule would admit everyone: none is rendered
    assert not admits(plugin, 8080, PROMETHEUS) and not admits(controller, 8080, PROMETHEUS)
    assert admits(controller, 8443, "10.0.0.7") and not admits(controller, 8443, TENANT)


def test_the_policies_follow_the_ports_and_the_components_that_exist() -> None:
    values = {"kubeletPlugin": {"metrics": {"port": 9400}}, "controller": {"metrics": {"port": 9500}},
              "webhook": {"enabled": False}}
    assert admits(one(values, "NetworkPolicy", "kubelet-plugin"), 9400, PROMETHEUS)
    controller = one(values, "NetworkPolicy", "controller")
    assert admits(controller, 9500, PROMETHEUS) and not admits(controller, 8443, TENANT)
    assert [p["metadata"]["name"] for p in find({"controller": {"enabled": False}}, "NetworkPolicy")] == [
        f"{RELEASE}-kubelet-plugin"]
    assert find({"networkPolicy": {"enabled": False}}, "NetworkPolicy") == []


def test_each_endpoint_s_bind_address_reaches_the_controller(monkeypatch: pytest.MonkeyPatch) -> None:
    from controller import controller_command as command

    values = {"controller": {"bindAddress": "::", "metrics": {"bindAddress": "127.0.0.1"},
                             "healthBindAddress": "::"},
              "webhook": {"bindAddress": "0.0.0.0"}}
    container = one(values, "Deployment", "controller")["spec"]["template"]["spec"]["containers"][0]
    for name, value in _env(container).items():
        if not value.startswith("fieldRef:"):
            monkeypatch.setenv(name, value)
    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    config = command.config_from_args(parser.parse_args([]))
    assert (config.bind_host, config.metrics_host, config.health_host, config.webhook_host) == (
        "::", "127.0.0.1", "::", "0.0.0.0")
    default = _env(one({}, "Deployment", "controller")["spec"]["template"]["spec"]["containers"][0])
    assert [default[n] for n in ("METRICS_BIND_ADDRESS", "HEALTH_BIND_ADDRESS", "WEBHOOK_BIND_ADDRESS")] == [""] * 3


@pytest.mark.parametrize("bad, field", [
    ({"controller": {"metrics": {"bindAddress": "localhost"}}}, "/controller/metrics/bindAddress"),
    ({"networkPolicy": {"metricsFrom": [{}]}}, "/networkPolicy/metricsFrom/0"),
    ({"networkPolicy": {"webhookFrom": [{"ipBlock": {}}]}}, "/networkPolicy/webhookFrom/0/ipBlock"),
])
def test_the_schema_rejects_bad_addresses_and_peers_naming_the_field(bad: dict[str, Any], field: str) -> None:
    with pytest.raises(helm.HelmValuesError) as info:
        _chart().render(bad, name=RELEASE, namespace=NAMESPACE)
    assert field in str(info.value)
