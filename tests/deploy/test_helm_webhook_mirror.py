"""The webhook configurations the local API server (demo, tests) registers are the chart's own:
same webhooks, rules, policies and selectors; only the client config (a URL instead of the
in-cluster Service) differs. A change to the chart that the mirror misses fails here."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

pytest.importorskip("helm_python")

from test_helm_chart import render

from testbed.apiserver.webhook_configs import gpuready_webhook_configurations

KINDS = ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")


def _webhooks(objs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    (config,) = [o for o in objs if o and o.get("kind") == kind]
    out = {}
    for hook in config["webhooks"]:
        hook = dict(hook)
        hook.pop("clientConfig")  # Service in the chart, URL locally: the one intended difference
        out[hook["name"]] = hook
    return out


def test_local_webhook_configurations_mirror_the_chart() -> None:
    chart_objs = [o for path, text in render({}).items() if path.endswith(".yaml")
                  for o in yaml.safe_load_all(text) if isinstance(o, dict)]
    local = gpuready_webhook_configurations("https://127.0.0.1:8443", b"pem")
    for kind in KINDS:
        chart_hooks, local_hooks = _webhooks(chart_objs, kind), _webhooks(local, kind)
        assert set(local_hooks) == set(chart_hooks), kind
        for name, hook in chart_hooks.items():
            assert local_hooks[name] == hook, (kind, name)
