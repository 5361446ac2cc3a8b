"""The kubelet's PodResources API (``v1.PodResourcesLister``) as the emulator serves it.

The real kubelet answers ``List`` from two things it has: the pods it runs (each container's
``resources.claims`` names the pod's claims it uses) and its cache of prepared claims (what each
DRA plugin's NodePrepareResources returned: pool, device, CDI IDs). The emulator has the second
(every ``RegisteredPlugin.prepare`` is recorded here, every unprepare forgets) but runs no pods, so
the test or demo says which pods exist and which claims each container references, with
:meth:`PodResourcesServer.set_pod`, as the pod's spec would tell the kubelet. Claims are named by
their real names (what ``pod.status.resourceClaimStatuses`` resolves a template to).

A container lists a claim only once the claim is prepared, as on a real node: before
NodePrepareResources succeeds the kubelet does not start the container. The emulator does not
filter by request (``resources.claims[].request``): a container gets every device of the claim.
``dynamic_resources=False`` answers like a kubelet with ``KubeletPodResourcesDynamicResources``
off (or older than 1.27): containers without their DRA devices.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping, Sequence
from concurrent import futures
from dataclasses import dataclass
from typing import Any

import grpc

from dra_driver.logs import get_logger
from proto import podresources_v1_pb2 as pb
from proto import podresources_v1_pb2_grpc as pb_grpc

log = get_logger(__name__)


@dataclass(frozen=True)
class PreparedClaimDevice:
    """One device a plugin returned for a prepared claim."""

    driver: str
    pool: str
    device: str
    cdi_device_ids: tuple[str, ...] = ()


class PodResourcesServer(pb_grpc.PodResourcesListerServicer):
    """Serves ``v1.PodResourcesLister`` on ``socket_path`` (see the module doc)."""

    def __init__(self, socket_path: str, *, dynamic_resources: bool = True) -> None:
        self.socket_path = socket_path
        self.dynamic_resources = dynamic_resources
        self._lock = threading.Lock()
        # (namespace, name) -> container name -> claim names it references, in spec order
        self._pods: dict[tuple[str, str], dict[str, tuple[str, ...]]] = {}
        # claim UID -> (namespace, name, devices of one driver); several drivers: several entries
        self._prepared: dict[tuple[str, str], tuple[str, str, tuple[PreparedClaimDevice, ...]]] = {}
        self._server: grpc.Server | None = None
        self.calls: list[str] = []  # method names answered, oldest first

    # -- lifecycle -------------------------------------------------------------------------------
    def start(self) -> PodResourcesServer:
        """Listen on the socket (a stale file at the path is replaced)."""
        os.makedirs(os.path.dirname(self.socket_path) or ".", exist_ok=True)
        if os.path.exists(self.socket_path):
            os.unlink(self.socket_path)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="podres"))
        pb_grpc.add_PodResourcesListerServicer_to_server(self, server)
        server.add_insecure_port(f"unix://{self.socket_path}")
        server.start()
        self._server = server
        log.info("kubelet_pod_resources_serving", socket=self.socket_path)
        return self

    def stop(self) -> None:
        """Stop serving and remove the socket. Idempotent."""
        if self._server is not None:
            self._server.stop(grace=None)
            self._server = None
        try:
            os.unlink(self.socket_path)
        except FileNotFoundError:
            pass

    # -- what the kubelet knows ------------------------------------------------------------------
    def set_pod(self, namespace: str, name: str, containers: Mapping[str, Sequence[str]]) -> None:
        """Say that pod ``namespace/name`` runs here; ``containers``: container name -> claim names."""
        with self._lock:
            self._pods[(namespace, name)] = {c: tuple(claims) for c, claims in containers.items()}

    def remove_pod(self, namespace: str, name: str) -> None:
        """The pod is gone from the node."""
        with self._lock:
            self._pods.pop((namespace, name), None)

    def record_prepared(self, driver: str, namespace: str, name: str, uid: str,
                        devices: Sequence[PreparedClaimDevice]) -> None:
        """A plugin prepared claim ``uid`` with ``devices`` (called by ``RegisteredPlugin.prepare``)."""
        with self._lock:
            self._prepared[(uid, driver)] = (namespace, name, tuple(devices))

    def forget_prepared(self, driver: str, uid: str) -> None:
        """A plugin unprepared claim ``uid``."""
        with self._lock:
            self._prepared.pop((uid, driver), None)

    # -- answers ---------------------------------------------------------------------------------
    def _pod_message(self, namespace: str, name: str, containers: Mapping[str, tuple[str, ...]]) -> Any:
        by_claim: dict[tuple[str, str], list[PreparedClaimDevice]] = {}
        for ns, claim, devices in self._prepared.values():
            by_claim.setdefault((ns, claim), []).extend(devices)
        out = pb.PodResources(name=name, namespace=namespace)
        for cname, claims in containers.items():
            c = out.containers.add(name=cname)
            if not self.dynamic_resources:
                continue
            for claim in claims:
                claim_devices = by_claim.get((namespace, claim))
                if not claim_devices:
                    continue  # not prepared: the kubelet would not have started this container
                dyn = c.dynamic_resources.add(claim_name=claim, claim_namespace=namespace)
                for d in claim_devices:
                    dyn.claim_resources.add(driver_name=d.driver, pool_name=d.pool, device_name=d.device,
                                            cdi_devices=[pb.CDIDevice(name=i) for i in d.cdi_device_ids])
        return out

    def List(self, request: Any, context: Any) -> Any:
        """Every pod with its containers' DRA devices."""
        with self._lock:
            self.calls.append("List")
            pods = [self._pod_message(ns, name, containers) for (ns, name), containers in sorted(self._pods.items())]
        return pb.ListPodResourcesResponse(pod_resources=pods)

    def Get(self, request: Any, context: Any) -> Any:
        """One pod; NOT_FOUND for a pod the node does not run (as the kubelet answers)."""
        with self._lock:
            self.calls.append("Get")
            containers = self._pods.get((request.pod_namespace, request.pod_name))
            message = None if containers is None else self._pod_message(request.pod_namespace,
                                                                          request.pod_name, containers)
        if message is None:
            context.abort(grpc.StatusCode.NOT_FOUND,
                          f"pod {request.pod_name} in namespace {request.pod_namespace} not found")
        return pb.GetPodResourcesResponse(pod_resources=message)

    def GetAllocatableResources(self, request: Any, context: Any) -> Any:
        """No device plugins, CPU or memory managers here: an empty answer (DRA devices are not listed)."""
        with self._lock:
            self.calls.append("GetAllocatableResources")
        return pb.AllocatableResourcesResponse()
