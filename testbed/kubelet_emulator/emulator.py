"""The kubelet's side of plugin registration, for tests and the demo.

Threading model: one watcher thread polls the plugin registry directory (the kubelet uses inotify;
polling every ``poll_interval`` seconds sees the same set of sockets without a native dependency)
and starts one registration thread per new socket file. A registration thread runs the kubelet's
handshake (GetInfo, validate, NotifyRegistrationStatus) and, like the kubelet's reconciler, retries
a failed or rejected registration with exponential backoff for as long as that same socket file
exists. All shared state sits behind one Condition, which waiters (``wait_for_plugin``) block on.

A socket file is identified by path plus inode and mtime, so a plugin that replaces its socket at
the same path (a restart) is deregistered and registered afresh; a rolling update, where the new
instance uses a different socket name, yields two registered instances of one driver, and the
most recently registered one is the one ``wait_for_plugin`` returns (the kubelet prefers it too).

When the last instance of a driver is gone, the kubelet waits ``wiping_delay`` (30 s) and then
deletes that driver's ResourceSlices for the node; a re-registration within the delay cancels it.
The emulator has no API client of its own, so it calls ``on_driver_gone(driver_name)`` at that
moment and the caller (the demo, a test) deletes the slices.
"""

from __future__ import annotations

import os
import stat
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType

import grpc

from dra_driver.logs import get_logger
from proto import pluginregistration_pb2, pluginregistration_pb2_grpc
from testbed.kubelet_emulator.plugin import RegisteredPlugin
from testbed.kubelet_emulator.pod_resources import PodResourcesServer
from testbed.kubelet_emulator.versions import RegistrationRejected, validate_plugin_info

log = get_logger(__name__)

_SocketKey = tuple[int, int]  # (inode, mtime_ns): changes when the file is replaced


@dataclass(frozen=True)
class RegistrationAttempt:
    """One registration handshake the emulator ran (history, for tests and the demo)."""

    socket: str
    driver_name: str  # "" when GetInfo itself failed
    accepted: bool
    error: str  # the reason sent to the plugin, or why GetInfo failed
    at: float  # time.monotonic()


class KubeletEmulator:
    """Watches a plugin registry directory and registers DRA plugins the way the kubelet does."""

    def __init__(
        self,
        registry_dir: str,
        *,
        poll_interval: float = 0.05,
        info_timeout: float = 5.0,
        retry_initial: float = 0.5,
        retry_max: float = 5.0,
        wiping_delay: float = 30.0,
        on_driver_gone: Callable[[str], None] | None = None,
        pod_resources_socket: str | None = None,
        pod_resources_dynamic: bool = True,
    ) -> None:
        """Create an emulator for ``registry_dir``; nothing happens until ``start()``.

        ``info_timeout`` bounds GetInfo and NotifyRegistrationStatus (the kubelet allows about 1 s;
        the default is looser for loaded test machines). Failed registrations are retried after
        ``retry_initial`` seconds, doubling up to ``retry_max``. ``on_driver_gone`` is called (from
        a timer thread) ``wiping_delay`` seconds after a driver's last instance went away, unless
        one registered again meanwhile.

        ``pod_resources_socket``: also serve the kubelet's PodResources API there (from ``start()``
        to ``stop()``), answering from the claims its plugins prepared and the pods given to
        :meth:`set_pod`; ``pod_resources_dynamic=False`` answers without DRA devices, like a
        kubelet with the KubeletPodResourcesDynamicResources gate off.
        """
        self.registry_dir = registry_dir
        self._poll_interval = poll_interval
        self._info_timeout = info_timeout
        self._retry_initial = retry_initial
        self._retry_max = retry_max
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None
        self._workers: list[threading.Thread] = []
        self._seen: dict[str, _SocketKey] = {}
        self._registered: dict[str, RegisteredPlugin] = {}  # registration socket path -> plugin
        self._rejects: deque[str] = deque()
        self._attempts: list[RegistrationAttempt] = []
        self._rejection_cursor = 0  # attempts before this index were seen by wait_for_rejection
        self._wiping_delay = wiping_delay
        self._on_driver_gone = on_driver_gone
        self._wipe_timers: dict[str, threading.Timer] = {}
        self.pod_resources: PodResourcesServer | None = (
            PodResourcesServer(pod_resources_socket, dynamic_resources=pod_resources_dynamic)
            if pod_resources_socket else None)

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self) -> KubeletEmulator:
        """Begin watching the registry directory (created if missing). Returns self."""
        if self._watcher is not None:
            raise RuntimeError("KubeletEmulator.start() called twice")
        os.makedirs(self.registry_dir, exist_ok=True)
        if self.pod_resources is not None:
            self.pod_resources.start()
        self._watcher = threading.Thread(target=self._watch, name="kubelet-emu-watch", daemon=True)
        self._watcher.start()
        log.info("kubelet_emulator_started", registry_dir=self.registry_dir)
        return self

    def stop(self) -> None:
        """Stop watching and close every plugin connection. Idempotent."""
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
        if self._watcher is not None:
            self._watcher.join(timeout=10)
        for worker in list(self._workers):
            worker.join(timeout=self._info_timeout * 2 + 1)
        with self._cond:
            plugins = list(self._registered.values())
            self._registered.clear()
            timers = list(self._wipe_timers.values())
            self._wipe_timers.clear()
            self._cond.notify_all()
        for timer in timers:
            timer.cancel()
        for plugin in plugins:
            plugin.close()
        with self._cond:
            self._cond.notify_all()
        if self.pod_resources is not None:
            self.pod_resources.stop()

    def __enter__(self) -> KubeletEmulator:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # -- controls and queries --------------------------------------------------------------------

    def reject_next_registration(self, reason: str) -> None:
        """Answer the next registration that would succeed with ``plugin_registered=False, error=reason``.

        The emulator then retries after the backoff, as the kubelet does, so the plugin normally
        sees the rejection and then, on the next attempt, an acceptance.
        """
        with self._cond:
            self._rejects.append(reason)

    def set_pod(self, namespace: str, name: str, containers: Mapping[str, Sequence[str]]) -> None:
        """Run pod ``namespace/name`` here, for the PodResources API: container name -> claim names.

        The emulator runs no containers; this stands for the pod spec the kubelet reads
        (``spec.containers[].resources.claims``). Needs ``pod_resources_socket``.
        """
        if self.pod_resources is None:
            raise RuntimeError("KubeletEmulator was created without pod_resources_socket")
        self.pod_resources.set_pod(namespace, name, containers)

    def remove_pod(self, namespace: str, name: str) -> None:
        """The pod left the node (PodResources no longer lists it)."""
        if self.pod_resources is not None:
            self.pod_resources.remove_pod(namespace, name)

    @property
    def attempts(self) -> list[RegistrationAttempt]:
        """Every registration handshake so far, oldest first."""
        with self._cond:
            return list(self._attempts)

    def plugins(self, driver_name: str | None = None) -> list[RegisteredPlugin]:
        """Currently registered plugin instances (optionally of one driver), oldest registration first."""
        with self._cond:
            found = [p for p in self._registered.values() if driver_name in (None, p.driver_name)]
        return sorted(found, key=lambda p: p.registered_at)

    def wait_for_plugin(
        self, driver_name: str, timeout: float = 10.0, *, endpoint: str | None = None
    ) -> RegisteredPlugin:
        """Return the most recently registered instance of ``driver_name`` (with ``endpoint`` if given).

        Waits up to ``timeout`` seconds; raises TimeoutError that lists the registration attempts
        seen meanwhile, so a rejected plugin's reason appears in the test failure.
        """
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                matches = [
                    p
                    for p in self._registered.values()
                    if p.driver_name == driver_name and endpoint in (None, p.endpoint)
                ]
                if matches:
                    return max(matches, key=lambda p: p.registered_at)
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._stop.is_set():
                    recent = [f"{a.socket}: accepted={a.accepted} {a.error}" for a in self._attempts[-5:]]
                    raise TimeoutError(
                        f"no plugin {driver_name!r}"
                        + (f" with endpoint {endpoint}" if endpoint else "")
                        + f" registered from {self.registry_dir} within {timeout} s; recent attempts: {recent}"
                    )
                self._cond.wait(remaining)

    def wait_for_deregistration(self, plugin: RegisteredPlugin, timeout: float = 10.0) -> None:
        """Wait until ``plugin``'s registration socket is gone or replaced and its connection closed (what
        the kubelet has done once it deregisters); raise TimeoutError otherwise."""
        deadline = time.monotonic() + timeout
        with self._cond:
            # Closed, not only forgotten: the watcher drops a plugin under the lock and closes it after.
            while self._registered.get(plugin.registration_socket) is plugin or not plugin.closed:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"{plugin!r} still registered after {timeout} s")
                self._cond.wait(remaining)

    def wait_for_rejection(self, timeout: float = 10.0) -> RegistrationAttempt:
        """Return the oldest refused registration not yet returned by this method, waiting if needed.

        Refusals that happened before the call count, so a test cannot miss one that raced ahead.
        """
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for index in range(self._rejection_cursor, len(self._attempts)):
                    if not self._attempts[index].accepted:
                        self._rejection_cursor = index + 1
                        return self._attempts[index]
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"no registration was refused within {timeout} s")
                self._cond.wait(remaining)

    # -- watcher ---------------------------------------------------------------------------------

    def _scan(self) -> dict[str, _SocketKey]:
        sockets: dict[str, _SocketKey] = {}
        try:
            entries = list(os.scandir(self.registry_dir))
        except FileNotFoundError:
            return sockets
        for entry in entries:
            if entry.name.startswith("."):  # the kubelet ignores hidden files
                continue
            try:
                st = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            if stat.S_ISSOCK(st.st_mode):
                sockets[entry.path] = (st.st_ino, st.st_mtime_ns)
        return sockets

    def _watch(self) -> None:
        while not self._stop.is_set():
            current = self._scan()
            gone: list[RegisteredPlugin] = []
            with self._cond:
                for path, key in list(self._seen.items()):
                    if current.get(path) != key:
                        del self._seen[path]
                        plugin = self._registered.pop(path, None)
                        if plugin is not None:
                            gone.append(plugin)
                for path, key in current.items():
                    if path not in self._seen:
                        self._seen[path] = key
                        worker = threading.Thread(
                            target=self._register_loop,
                            args=(path, key),
                            name="kubelet-emu-register",
                            daemon=True,
                        )
                        self._workers = [w for w in self._workers if w.is_alive()]
                        self._workers.append(worker)
                        worker.start()
                if gone:
                    self._cond.notify_all()
                for driver in {p.driver_name for p in gone}:
                    if self._on_driver_gone is not None and not any(
                        p.driver_name == driver for p in self._registered.values()
                    ):
                        self._schedule_wipe(driver)
            for plugin in gone:
                log.info("kubelet_plugin_deregistered", driver=plugin.driver_name, endpoint=plugin.endpoint)
                plugin.close()
            if gone:
                with self._cond:
                    self._cond.notify_all()  # wait_for_deregistration waits for the close too
            self._stop.wait(self._poll_interval)

    def _schedule_wipe(self, driver: str) -> None:
        """Start the wiping-delay timer for ``driver`` (caller holds the lock)."""
        if driver in self._wipe_timers:
            return
        timer = threading.Timer(self._wiping_delay, self._wipe, args=(driver,))
        timer.daemon = True
        self._wipe_timers[driver] = timer
        timer.start()
        log.info("kubelet_driver_gone_wipe_scheduled", driver=driver, delay_s=self._wiping_delay)

    def _wipe(self, driver: str) -> None:
        with self._cond:
            if self._wipe_timers.pop(driver, None) is None or self._stop.is_set():
                return  # cancelled by a re-registration or by stop()
            if any(p.driver_name == driver for p in self._registered.values()):
                return
        log.info("kubelet_wiping_driver_slices", driver=driver)
        if self._on_driver_gone is not None:
            try:
                self._on_driver_gone(driver)
            except Exception:
                # The kubelet retries its wipe with backoff; here the caller sees the log line.
                log.error("kubelet_wipe_callback_failed", exc_info=True, driver=driver)

    def _still_current(self, path: str, key: _SocketKey) -> bool:
        with self._cond:
            return not self._stop.is_set() and self._seen.get(path) == key

    def _register_loop(self, path: str, key: _SocketKey) -> None:
        delay = self._retry_initial
        while self._still_current(path, key):
            if self._register_once(path, key):
                return
            if self._stop.wait(delay):
                return
            delay = min(delay * 2, self._retry_max)

    def _record(self, path: str, name: str, accepted: bool, error: str) -> None:
        with self._cond:
            self._attempts.append(RegistrationAttempt(path, name, accepted, error, time.monotonic()))
            self._cond.notify_all()
        if not accepted:
            log.warning("kubelet_registration_failed", socket=path, driver=name, error=error)

    def _register_once(self, path: str, key: _SocketKey) -> bool:
        """One handshake over the registration socket; True when the plugin ended up registered."""
        with grpc.insecure_channel(f"unix://{path}") as channel:
            stub = pluginregistration_pb2_grpc.RegistrationStub(channel)
            try:
                info = stub.GetInfo(pluginregistration_pb2.InfoRequest(), timeout=self._info_timeout)
            except grpc.RpcError as err:
                self._record(path, "", False, f"GetInfo failed: {err.code().name}: {err.details()}")
                return False
            versions = list(info.supported_versions)
            try:
                choice = validate_plugin_info(info.type, info.name, info.endpoint, versions, path)
                with self._cond:
                    reason = self._rejects.popleft() if self._rejects else None
                if reason is not None:
                    raise RegistrationRejected(reason)
                self._check_endpoint_free(path, info.name, info.endpoint)
            except RegistrationRejected as rejected:
                self._notify(stub, path, False, str(rejected))
                self._record(path, info.name, False, str(rejected))
                return False
            if not self._notify(stub, path, True, ""):
                self._record(path, info.name, False, "NotifyRegistrationStatus failed")
                return False
        plugin = RegisteredPlugin(
            driver_name=info.name,
            endpoint=info.endpoint,
            dra_service=choice.dra_service,
            versions=versions,
            health_services=choice.health_services,
            registration_socket=path,
            pod_resources=self.pod_resources,
        )
        with self._cond:
            if self._stop.is_set() or self._seen.get(path) != key:
                current = False  # the socket went away during the handshake
            else:
                current = True
                self._registered[path] = plugin
                timer = self._wipe_timers.pop(info.name, None)
                if timer is not None:
                    timer.cancel()  # re-registered within the wiping delay: keep the slices
                self._attempts.append(RegistrationAttempt(path, info.name, True, "", time.monotonic()))
                self._cond.notify_all()
        if not current:
            plugin.close()
            return True  # nothing more to do for this socket file
        log.info(
            "kubelet_plugin_registered",
            driver=info.name,
            endpoint=info.endpoint,
            dra_service=choice.dra_service,
            health=",".join(choice.health_services) or None,
            socket=path,
        )
        return True

    def _check_endpoint_free(self, path: str, name: str, endpoint: str) -> None:
        with self._cond:
            for other_path, other in self._registered.items():
                if other_path != path and other.endpoint == endpoint:
                    raise RegistrationRejected(
                        f"endpoint {endpoint} of plugin {name} is already registered by {other_path}: "
                        "each instance needs its own DRA socket"
                    )

    def _notify(
        self, stub: pluginregistration_pb2_grpc.RegistrationStub, path: str, registered: bool, error: str
    ) -> bool:
        """Send NotifyRegistrationStatus; True when the plugin took it.

        The Go helper answers an error to a negative status on purpose, so that failure is expected
        and only logged at debug level.
        """
        try:
            stub.NotifyRegistrationStatus(
                pluginregistration_pb2.RegistrationStatus(plugin_registered=registered, error=error),
                timeout=self._info_timeout,
            )
            return True
        except grpc.RpcError as err:
            if registered:
                log.warning("kubelet_notify_failed", socket=path, error=f"{err.code().name}: {err.details()}")
            else:
                log.debug("kubelet_notify_rejection_answered_error", socket=path, error=err.details())
            return False
