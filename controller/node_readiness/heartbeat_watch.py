"""The leader's watch of the kubelet plugins' heartbeats: a dead plugin's GPUs leave the cluster.

Every replica watches the heartbeat Leases of its namespace (label selector
``app.kubernetes.io/component=kubelet-plugin-heartbeat``) on a thread of its own and notes when it
saw each renewal (:func:`~controller.node_readiness.heartbeat_rule.observe`); the replica keeps only
that, not the objects. While the replica leads, a second thread (``plugin-heartbeats``) runs
:meth:`PluginHeartbeats.reconcile` when a verdict can change: a Lease added, deleted or handed over,
a renewal of a tainted node, one of our DeviceTaintRules changed, leadership gained, or the moment
the earliest live heartbeat would lapse (and every ``resync_s`` regardless). A renewal of a live node
wakes no one, and this thread is not the leader loop: 1,000 nodes renewing every 2 s must not run
the allocator's and reconciler's pass every few seconds. Each pass writes what the rule decided
(:mod:`controller.node_readiness.plugin_down`):

- lapsed: create the node's DeviceTaintRule (NoSchedule on its pool), set GPUReady to
  ``PluginNotRunning`` and record a Warning Event on the Node;
- back (or no Lease any more, or no Node): delete the rule, put the plugin's GPUReady back (unless
  it wrote one meanwhile) and record a Normal Event.

Where the cluster serves no DeviceTaintRule (Kubernetes before 1.36, or 1.36 with the
``DRADeviceTaintRules`` gate off) the devices cannot be tainted: the controller logs
``plugin_heartbeat_cannot_taint`` once, and still writes the condition and the Event (with
``readinessTaint.mode=continuous`` the node's readiness taint then keeps new pods off the node).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from controller.api_client import COORDINATION_V1, CORE_V1, ApiError, KubeApi, namespaced
from controller.controller_metrics import ControllerMetrics
from controller.informers import BACKOFF, ClusterCache
from controller.node_readiness import plugin_down
from controller.node_readiness.heartbeat_rule import (
    Heartbeat,
    HeartbeatPolicy,
    Liveness,
    Verdict,
    inherited,
    judge,
    observe,
    read_lease,
)
from dra_driver import informer as list_watch
from dra_driver.heartbeat_lease import HEARTBEAT_SELECTOR, lease_name
from dra_driver.kube_api import describe_error
from dra_driver.logs import get_logger

log = get_logger(__name__)

RBAC_V1 = "/apis/rbac.authorization.k8s.io/v1"


class PluginHeartbeats:
    """Heartbeats in, DeviceTaintRules, GPUReady and Events out (writes by the leader only)."""

    def __init__(self, api: KubeApi, cache: ClusterCache, driver: str, namespace: str, policy: HeartbeatPolicy,
                 is_leader: Callable[[], bool], rule_owner: str = "", clock: Callable[[], float] = time.time,
                 resync_s: float = 30.0, metrics: ControllerMetrics | None = None) -> None:
        self.api, self.cache, self.driver, self.namespace, self.policy = api, cache, driver, namespace, policy
        self._is_leader, self._rule_owner, self._clock, self._resync_s = is_leader, rule_owner, clock, resync_s
        self._metrics = metrics
        self._lock = threading.Lock()
        self._heartbeats: dict[str, Heartbeat] = {}  # node -> what the watch saw (informer thread writes)
        self._liveness: dict[str, Liveness] = {}  # node -> the leader's verdicts (the writer thread only)
        self._tainted: set[str] = set()  # nodes tainted now, read by the informer thread to decide a wake
        self._pending: dict[str, dict[str, Any] | None] = {}  # rule written or deleted, not in the cache yet
        self._owner: dict[str, Any] | None = None
        self._told: set[str] = set()  # one-time log lines already written
        # Down, told through GPUReady only (no DeviceTaintRule served): node -> the plugin's condition before.
        self._marked_unserved: dict[str, dict[str, Any] | None] = {}
        self._pass_lock = threading.Lock()  # a pass and forget() (leadership lost) never interleave
        self._problems: dict[str, str] = {}  # node -> the Lease problem last logged
        self._kick = threading.Event()
        self._stop = threading.Event()
        self._wake_at: float | None = None  # the next moment a verdict can change by the clock alone
        self._thread: threading.Thread | None = None
        self.passes = 0
        self._watch = list_watch.Informer(
            api, namespaced(COORDINATION_V1, "leases", namespace), label_selector=HEARTBEAT_SELECTOR,
            on_event=self._on_event, backoff=BACKOFF, log_fields={"kind": "leases", "namespace": namespace},
            name="informer-heartbeats")
        # Someone deleted or changed one of our rules: look again (the leader puts back what is due).
        cache.taint_rules.add_handler(self._rule_changed)

    # --- lifecycle -------------------------------------------------------------------------------
    def start(self) -> PluginHeartbeats:
        """Start the Lease watch and the writer thread (which writes only while ``is_leader()``)."""
        self._watch.start()
        self._thread = threading.Thread(target=self._run, name="plugin-heartbeats", daemon=True)
        self._thread.start()
        log.info("plugin_heartbeat_watch_started", namespace=self.namespace, threshold_s=self.policy.threshold_s,
                 handover_s=self.policy.handover_s)
        return self

    def stop(self) -> None:
        """Stop both threads (rules stay: the next leader takes them over)."""
        self._stop.set()
        self._kick.set()
        self._watch.stop()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def kick(self) -> None:
        """Ask for a pass now (leadership gained; tests)."""
        self._kick.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            wake_at = self._wake_at
            timeout = self._resync_s if wake_at is None else min(self._resync_s, max(0.0, wake_at - self._clock()))
            self._kick.wait(timeout)
            if self._stop.is_set():
                return
            self._kick.clear()
            if self._is_leader() and self.cache.synced:
                self.reconcile()
                self.passes += 1
            elif not self.cache.synced:
                self._stop.wait(0.05)

    def _rule_changed(self, event: str, _key: str, rule: dict[str, Any] | None) -> None:
        if event != "RESYNC" and (rule is None or plugin_down.is_ours(rule)):
            self._kick.set()

    def forget(self) -> None:
        """Leadership lost: the next leader (maybe this replica again) starts from the rules on the server."""
        with self._pass_lock:
            self._liveness.clear()
            self._pending.clear()
            self._marked_unserved.clear()
            self._wake_at = None
            with self._lock:
                self._tainted.clear()
            if self._metrics is not None:
                self._metrics.set_plugin_down_nodes(())  # the next leader reports them

    # --- the watch (informer thread) ---------------------------------------------------------------
    def _on_event(self, typ: str, lease: dict[str, Any]) -> None:
        view = read_lease(lease)
        if view is None:
            return
        now = self._clock()
        with self._lock:
            before = self._heartbeats.get(view.node)
            if typ == "DELETED":
                self._heartbeats.pop(view.node, None)
            else:
                self._heartbeats[view.node] = observe(before, view, now)
            tainted = view.node in self._tainted
        if view.problem and self._problems.get(view.node) != view.problem:
            self._problems[view.node] = view.problem
            log.warning("plugin_heartbeat_malformed", node=view.node, lease=f"{self.namespace}/{lease_name(view.node)}",
                        problem=view.problem, effect="judged by its renewals alone")
        if typ == "DELETED" or before is None or tainted or before.holder != view.holder:
            self._kick.set()

    def heartbeat(self, node: str) -> Heartbeat | None:
        """What the watch saw of ``node``'s heartbeat (None: no Lease)."""
        with self._lock:
            return self._heartbeats.get(node)

    # --- the leader's pass ---------------------------------------------------------------------------
    def reconcile(self) -> None:
        """Judge every node with a heartbeat or a rule, write what changed, note when to look again."""
        with self._pass_lock:
            try:
                self._reconcile()
            except Exception as exc:  # never the other jobs' pass: the next wake-up tries again
                log.error("plugin_heartbeat_pass_failed", error=repr(exc)[:500])

    def _reconcile(self) -> None:
        now = self._clock()
        with self._lock:
            heartbeats = dict(self._heartbeats)
        rules = self._our_rules()
        wake_at: float | None = None
        for node in sorted(set(heartbeats) | set(rules) | set(self._liveness)):
            rule = rules.get(node)
            previous = self._liveness.get(node)
            if previous is None and rule is not None:
                previous = inherited(now)  # tainted before this leader: lifted by a renewal seen from now on
            hb = heartbeats.get(node) if self.cache.nodes.get(node) is not None else None
            verdict = judge(previous, hb, now, self.policy)
            self._apply(node, verdict, rule, hb, now)
            if verdict.wake_at is not None:
                wake_at = verdict.wake_at if wake_at is None else min(wake_at, verdict.wake_at)
        self._wake_at = wake_at
        if self._metrics is not None:
            self._metrics.set_plugin_down_nodes(self.tainted_nodes())

    def _apply(self, node: str, verdict: Verdict, rule: dict[str, Any] | None, hb: Heartbeat | None,
               now: float) -> None:
        if verdict.liveness is None:
            self._liveness.pop(node, None)
        else:
            self._liveness[node] = verdict.liveness
        marked = rule is not None or node in self._marked_unserved
        if verdict.tainted and not marked:
            assert verdict.liveness is not None
            if self._taint(node, verdict.liveness.since, now, hb):
                self._set_tainted(node, True)
        elif not verdict.tainted and marked:
            if self._lift(node, rule, now, "no heartbeat Lease" if hb is None else "heartbeat renewed"):
                self._set_tainted(node, False)
        else:
            self._set_tainted(node, verdict.tainted)

    def _set_tainted(self, node: str, tainted: bool) -> None:
        """Record the node's state and its gauge at once: before its Event goes out, so whoever sees the
        Event (an operator, a test) finds the metric agreeing."""
        with self._lock:
            (self._tainted.add if tainted else self._tainted.discard)(node)
            nodes = set(self._tainted)
        if self._metrics is not None:
            self._metrics.set_plugin_down_nodes(nodes)

    def tainted_nodes(self) -> set[str]:
        """The nodes whose pool carries the plugin-down taint now (as far as this leader wrote or saw)."""
        with self._lock:
            return set(self._tainted)

    def _our_rules(self) -> dict[str, dict[str, Any]]:
        ours = {plugin_down.rule_node(r): r for r in self.cache.taint_rules.items() if plugin_down.is_ours(r)}
        for node, rule in list(self._pending.items()):
            if (node in ours) == (rule is not None):
                del self._pending[node]  # the cache caught up with the write
            elif rule is None:
                ours.pop(node, None)
            else:
                ours[node] = rule
        ours.pop("", None)
        return ours

    # --- writes ------------------------------------------------------------------------------------
    def _rules_path(self) -> str | None:
        rules = self.cache.taint_rules
        if rules.served:
            return rules.kind.path
        if "unserved" not in self._told:
            self._told.add("unserved")
            log.warning("plugin_heartbeat_cannot_taint", versions=",".join(rules.versions),
                        effect="this cluster serves no DeviceTaintRule (Kubernetes 1.36+ with DRADeviceTaintRules, "
                               "on by default from 1.37): a down plugin's GPUs stay offered; GPUReady and a Node "
                               "Event still say so")
        return None

    def _taint(self, node: str, since: float, now: float, hb: Heartbeat | None) -> bool:
        node_obj = self.cache.nodes.get(node) or {}
        index, previous = plugin_down.gpu_ready_condition(node_obj)
        if previous is not None and previous.get("reason") == plugin_down.REASON:
            previous = None  # ours from an earlier lapse: the plugin's own one went into that rule
        name = plugin_down.rule_name(node)
        fields = {"node": node, "last_heartbeat_seen": plugin_down.rfc3339(since),
                  "renew_time": hb.renew_time if hb is not None else "", "holder": hb.holder if hb is not None else ""}
        path = self._rules_path()
        if path is not None:
            version = path.split("/")[3]
            body = plugin_down.taint_rule(node, self.driver, version, since, self._rule_owner_ref(), previous)
            try:
                created = self.api.request("POST", path, body=body)
            except ApiError as exc:
                if exc.status != 409:
                    log.warning("plugin_down_taint_failed", **fields, rule=name, error=describe_error(exc))
                    self._count("taint", ok=False)
                    return False
                created = body  # already there (an earlier write whose event has not arrived)
            self._pending[node] = created
            log.warning("plugin_down_tainted", **fields, rule=name, taint=plugin_down.taint_key(self.driver))
        else:
            self._marked_unserved[node] = previous
            log.warning("plugin_down_not_tainted", **fields, reason="DeviceTaintRule not served")
        self._set_tainted(node, True)
        self._count("taint", ok=True)
        lease = f"{self.namespace}/{lease_name(node)}"
        condition = plugin_down.down_condition(lease, since, now, name if path else "not served by this cluster")
        self._write_condition(node, index, condition, expect_reason=None)
        self._event(node_obj, node, "GPUPluginNotRunning", "Warning", condition["message"])
        return True

    def _lift(self, node: str, rule: dict[str, Any] | None, now: float, why: str) -> bool:
        path = self._rules_path()
        name = str(((rule or {}).get("metadata") or {}).get("name") or plugin_down.rule_name(node))
        before = self._marked_unserved.pop(node, None)
        if path is not None and rule is not None:
            try:
                self.api.request("DELETE", f"{path}/{name}")
            except ApiError as exc:
                if exc.status != 404:
                    log.warning("plugin_down_lift_failed", node=node, rule=name, error=describe_error(exc))
                    self._count("lift", ok=False)
                    return False
        self._pending[node] = None
        self._set_tainted(node, False)
        self._count("lift", ok=True)
        log.info("plugin_down_lifted", node=node, rule=name, why=why)
        node_obj = self.cache.nodes.get(node)
        if node_obj is None:
            return True
        index, current = plugin_down.gpu_ready_condition(node_obj)
        if current is not None and current.get("reason") == plugin_down.REASON:
            restored = (plugin_down.previous_condition(rule) if rule is not None else before) \
                or plugin_down.returned_condition(now)
            self._write_condition(node, index, {**restored, "lastHeartbeatTime": plugin_down.rfc3339(now)},
                                  expect_reason=plugin_down.REASON)
        self._event(node_obj, node, "GPUPluginRunning", "Normal",
                    f"the gpuready kubelet plugin is back ({why}): its GPUs are offered to new claims again")
        return True

    def _count(self, action: str, ok: bool) -> None:
        if self._metrics is not None:
            self._metrics.plugin_down_change(action, ok)

    def _write_condition(self, node: str, index: int, condition: dict[str, Any], expect_reason: str | None) -> None:
        ops = plugin_down.condition_patch(index, condition, expect_reason)
        try:
            updated = self.api.json_patch(f"{CORE_V1}/nodes/{node}/status", ops)
        except ApiError as exc:
            # 422: the condition changed since it was read (the plugin wrote it): the plugin's word stands.
            (log.info if exc.status in (409, 422) else log.warning)(
                "plugin_down_condition_not_written", node=node, reason=condition.get("reason"),
                error=describe_error(exc))
            return
        self.cache.nodes.apply_local(updated)

    def _event(self, node_obj: dict[str, Any], node: str, reason: str, kind: str, message: str) -> None:
        uid = (node_obj.get("metadata") or {}).get("uid", "")
        self.api.event({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node, "uid": uid}}, reason,
                       message, kind)

    def _rule_owner_ref(self) -> dict[str, Any] | None:
        """The controller's ClusterRole as the rules' owner: ``helm uninstall`` deletes it, and with it
        (garbage collector) every rule this controller added."""
        if not self._rule_owner or self._owner is not None:
            return self._owner
        try:
            role = self.api.get(f"{RBAC_V1}/clusterroles/{self._rule_owner}")
        except ApiError as exc:
            role = None
            log.warning("taint_rule_owner_unreadable", cluster_role=self._rule_owner, error=describe_error(exc))
        if role is None:
            if "owner" not in self._told:
                self._told.add("owner")
                log.warning("taint_rule_owner_missing", cluster_role=self._rule_owner,
                            effect="rules are written without an owner: an uninstall leaves them")
            return None
        self._owner = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                       "name": self._rule_owner, "uid": (role.get("metadata") or {}).get("uid", "")}
        return self._owner
