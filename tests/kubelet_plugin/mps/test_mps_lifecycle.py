"""The MPS control daemon's lifecycle through the real plugin: prepare starts it, the CDI spec points at it,
unprepare stops it, a restarted plugin finds it, and a node that cannot run it fails the claim cleanly.

The daemon is a small stand-in ``nvidia-cuda-mps-control`` (below) written into a temp directory: what is
under test is gpuready's process lifecycle and files (which process runs, with which environment and
commands, and what is left on disk), which the stand-in exercises for real (fork, PID file, Unix socket,
/dev/shm). The real tool on a real GPU is in tests/kubelet_plugin/mps/test_mps_gpu.py.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest

from dra_driver.opaque_config import API_VERSION
from kubelet_plugin.cdi.driver_files import find_driver_binary
from kubelet_plugin.checkpoint.records import ClaimState
from kubelet_plugin.mps.control_daemon import MpsControl, MpsControlSettings, read_pid
from kubelet_plugin.mps.mps_dirs import claim_dir_name, daemon_alive
from testbed.cdi_loader import loader_problems
from testbed.device_samples import gpu_named
from testbed.fake_mps_control import events, write_fake
from testbed.plugin_harness import PluginHarness, opaque

NODE = "node-mps"


def _mps(pct: int | None = 50, limit: str | None = "8Gi") -> dict[str, Any]:
    mps: dict[str, Any] = {}
    if pct is not None:
        mps["defaultActiveThreadPercentage"] = pct
    if limit is not None:
        mps["defaultPinnedDeviceMemoryLimit"] = limit
    return opaque({"apiVersion": API_VERSION, "kind": "GpuConfig", "sharing": {"strategy": "MPS", "mps": mps}})


@pytest.fixture(scope="module")
def h() -> Iterator[PluginHarness]:
    with PluginHarness() as harness:
        harness.start_plugin(NODE, "sim:8xh100")
        yield harness


@pytest.fixture
def fake_on_path(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    """The stand-in on PATH (the plugin's default lookup; no MPS_CONTROL_PATH), its record file, and
    at the end the kill of any daemon it left running, whatever the test did."""
    bin_dir = str(tmp_path / "bin")
    binary = write_fake(bin_dir)
    record = str(tmp_path / "record.jsonl")
    monkeypatch.setenv("FAKE_MPS_RECORD", record)
    monkeypatch.setenv("PATH", bin_dir + os.pathsep + os.environ.get("PATH", ""))
    monkeypatch.delenv("MPS_CONTROL_PATH", raising=False)
    yield {"binary": binary, "record": record, "bin": bin_dir}
    for e in events(record):
        if e["kind"] == "daemon" and daemon_alive(e["pid"]):
            os.kill(e["pid"], signal.SIGKILL)


@pytest.fixture
def fake(h: PluginHarness, fake_on_path: dict[str, str]) -> dict[str, str]:
    """``fake_on_path`` for the module's plugin, with short daemon start and stop timeouts."""
    h.plugins[NODE].preparer.mps = MpsControl(MpsControlSettings(start_timeout=5.0, stop_timeout=3.0, node=NODE))
    return fake_on_path


def _claim_dirs(h: PluginHarness, uid: str) -> dict[str, str]:
    root = os.path.join(h.node_dirs(NODE).plugin, "mps", claim_dir_name(uid))
    return {"root": root, "pipe": os.path.join(root, "pipe"), "log": os.path.join(root, "log"),
            "shm": os.path.join(root, "shm")}


def test_prepare_starts_one_daemon_the_spec_points_at_it_and_unprepare_stops_it(
        h: PluginHarness, fake: dict[str, str]) -> None:
    uid = h.create_claim("mps-one", [("gpu", NODE, "gpu-0")], config=[_mps(50, "8Gi")])
    gpu0 = gpu_named(h.plugins[NODE].inventory.current().devices, "gpu-0")
    kubelet = h.kubelet(NODE)
    result = kubelet.prepare([("default", "mps-one", uid)])[uid]
    assert result.ok, result.error
    dirs = _claim_dirs(h, uid)

    starts = [e for e in events(fake["record"]) if e["kind"] == "start"]
    assert len(starts) == 1 and starts[0]["argv"] == ["-d"]
    assert starts[0]["env"] == {"CUDA_VISIBLE_DEVICES": gpu0.uuid, "CUDA_MPS_PIPE_DIRECTORY": dirs["pipe"],
                                "CUDA_MPS_LOG_DIRECTORY": dirs["log"]}
    commands = [e["command"] for e in events(fake["record"]) if e["kind"] == "command"]
    assert commands == ["set_default_active_thread_percentage 50",
                        f"set_default_device_pinned_mem_limit {gpu0.uuid} 8192M"]
    pid = read_pid(dirs["pipe"])
    assert daemon_alive(pid)
    daemon = next(e for e in events(fake["record"]) if e["kind"] == "daemon")
    assert daemon["pid"] == pid
    # The daemon's /dev/shm is the claim's shm directory (what the container gets as /dev/shm).
    assert os.listdir(dirs["shm"]) == [daemon["shm_marker"]]
    assert not os.path.exists(os.path.join("/dev/shm", daemon["shm_marker"]))

    spec = h.read_spec(NODE, uid)
    assert loader_problems(spec) == []
    edits = spec["devices"][0]["containerEdits"]
    assert f"CUDA_MPS_PIPE_DIRECTORY={dirs['pipe']}" in edits["env"]
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50" in edits["env"]
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=8192M" in edits["env"]
    assert {(m["hostPath"], m["containerPath"]) for m in edits["mounts"]} == {
        (dirs["pipe"], dirs["pipe"]), (dirs["shm"], "/dev/shm")}
    record = h.plugins[NODE].checkpoint.get(uid)
    assert record is not None and record.mps is not None and record.mps.pid == pid

    # A repeated prepare (kubelet restart) answers from the checkpoint: still exactly one daemon.
    assert kubelet.prepare([("default", "mps-one", uid)])[uid] == result
    assert len([e for e in events(fake["record"]) if e["kind"] == "start"]) == 1

    assert kubelet.unprepare([("default", "mps-one", uid)]) == {uid: ""}
    assert "quit" in [e["command"] for e in events(fake["record"]) if e["kind"] == "command"]
    assert not daemon_alive(pid)
    assert not os.path.exists(dirs["root"])
    assert f"k8s.gpu.nvidia.com-claim_{uid}.json" not in h.cdi_files(NODE)
    assert h.plugins[NODE].checkpoint.get(uid) is None


def test_claims_without_mps_start_no_daemon(h: PluginHarness, fake: dict[str, str]) -> None:
    uid = h.create_claim("ts", [("gpu", NODE, "gpu-1")], config=[opaque(
        {"apiVersion": API_VERSION, "kind": "GpuConfig", "sharing": {"strategy": "TimeSlicing"}})])
    result = h.kubelet(NODE).prepare([("default", "ts", uid)])[uid]
    assert result.ok, result.error
    assert events(fake["record"]) == []
    env = h.read_spec(NODE, uid)["devices"][0]["containerEdits"]["env"]
    assert not any(e.startswith(("CUDA_MPS_", "GPUREADY_TIMESLICE_INTERVAL")) for e in env)
    assert h.kubelet(NODE).unprepare([("default", "ts", uid)]) == {uid: ""}


def test_missing_binary_fails_the_claim_naming_the_field_and_leaves_nothing(
        h: PluginHarness, fake: dict[str, str], tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    empty_root = str(tmp_path / "driver-root")
    os.makedirs(empty_root)
    h.plugins[NODE].preparer.mps = MpsControl(MpsControlSettings(driver_root=empty_root))
    uid = h.create_claim("mps-nobin", [("gpu", NODE, "gpu-2")], config=[_mps()])
    good = h.create_claim("plain", [("gpu", NODE, "gpu-3")])
    results = h.kubelet(NODE).prepare([("default", "mps-nobin", uid), ("default", "plain", good)])
    error = results[uid].error
    assert "sharing.strategy: MPS" in error and "ResourceClaim default/mps-nobin" in error
    assert "nvidia-cuda-mps-control was not found" in error and f"{empty_root}/usr/bin" in error
    assert "MPS_CONTROL_PATH" in error  # the fix
    assert results[good].ok  # the other claim of the call is unaffected
    assert f"k8s.gpu.nvidia.com-claim_{uid}.json" not in h.cdi_files(NODE)
    assert h.plugins[NODE].checkpoint.get(uid) is None
    assert not os.path.exists(_claim_dirs(h, uid)["root"])
    assert events(fake["record"]) == []
    assert h.kubelet(NODE).unprepare([("default", "plain", good)]) == {good: ""}


def test_daemon_that_never_comes_up_fails_the_claim_and_is_not_left_running(
        h: PluginHarness, fake: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_MPS_MODE", "hang")
    h.plugins[NODE].preparer.mps = MpsControl(MpsControlSettings(start_timeout=1.0, stop_timeout=1.0))
    uid = h.create_claim("mps-hang", [("gpu", NODE, "gpu-4")], config=[_mps()])
    error = h.kubelet(NODE).prepare([("default", "mps-hang", uid)])[uid].error
    assert "sharing.strategy: MPS" in error and "did not come up within 1s" in error
    hung = [e["pid"] for e in events(fake["record"]) if e["kind"] == "daemon"]
    assert len(hung) == 1 and not daemon_alive(hung[0])  # found by its pipe directory and stopped
    assert f"k8s.gpu.nvidia.com-claim_{uid}.json" not in h.cdi_files(NODE)
    assert h.plugins[NODE].checkpoint.get(uid) is None
    assert not os.path.exists(_claim_dirs(h, uid)["root"])


def test_configured_binary_and_driver_root_lookup(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    root = str(tmp_path / "driver")
    binary = write_fake(os.path.join(root, "usr", "bin"))
    monkeypatch.setenv("PATH", "/nonexistent")
    assert find_driver_binary("nvidia-cuda-mps-control", root) == binary
    assert MpsControl(MpsControlSettings(driver_root=root)).locate() == binary
    monkeypatch.setenv("MPS_CONTROL_PATH", str(tmp_path / "nope"))
    with pytest.raises(Exception, match="MPS_CONTROL_PATH setting"):
        MpsControl(MpsControlSettings(driver_root=root)).locate()
    assert MpsControl(MpsControlSettings(binary=binary)).locate() == binary


def test_different_thread_percentages_in_one_claim_are_refused(h: PluginHarness, fake: dict[str, str]) -> None:
    uid = h.create_claim("mps-mixed", [("a", NODE, "gpu-4"), ("b", NODE, "gpu-5")],
                         config=[{**_mps(30), "requests": ["a"]}, {**_mps(60), "requests": ["b"]}])
    error = h.kubelet(NODE).prepare([("default", "mps-mixed", uid)])[uid].error
    assert "sharing.mps.defaultActiveThreadPercentage differs" in error and "gpu-4=30" in error
    assert events(fake["record"]) == [] and h.plugins[NODE].checkpoint.get(uid) is None


def test_restarted_plugin_keeps_the_daemon_and_its_unprepare_stops_it(fake_on_path: dict[str, str]) -> None:
    record = fake_on_path["record"]
    with PluginHarness() as h:
        h.start_plugin(NODE, "sim:8xh100")
        uid = h.create_claim("mps-restart", [("gpu", NODE, "gpu-0")], config=[_mps(40, None)])
        first = h.kubelet(NODE)
        result = first.prepare([("default", "mps-restart", uid)])[uid]
        assert result.ok, result.error
        pid = read_pid(_claim_dirs(h, uid)["pipe"])
        assert daemon_alive(pid)

        # A second claim whose prepare "crashed" after its daemon started (record still in phase 1).
        crashed = h.create_claim("mps-crashed", [("gpu", NODE, "gpu-1")], config=[_mps(40, None)])
        assert first.prepare([("default", "mps-crashed", crashed)])[crashed].ok
        crashed_pid = read_pid(_claim_dirs(h, crashed)["pipe"])
        with h.plugins[NODE].checkpoint.update() as records:
            records[crashed] = replace(records[crashed], state=ClaimState.PREPARE_STARTED)

        # A third claim whose daemon dies with the plugin (a container restart takes its processes).
        killed = h.create_claim("mps-killed", [("gpu", NODE, "gpu-2")], config=[_mps(40, None)])
        assert first.prepare([("default", "mps-killed", killed)])[killed].ok
        killed_pid = read_pid(_claim_dirs(h, killed)["pipe"])

        h.stop_plugin(NODE)  # the plugin goes; its daemons keep serving the running pods
        assert daemon_alive(pid) and daemon_alive(crashed_pid)
        assert killed_pid is not None
        os.kill(killed_pid, signal.SIGKILL)  # leaves its PID file and socket behind, as a crash does
        h.start_plugin(NODE, "sim:8xh100")  # same directories, same checkpoint
        # Start-up recovery rolled the half-done prepare back, daemon included...
        assert not daemon_alive(crashed_pid) and not os.path.exists(_claim_dirs(h, crashed)["root"])
        # ...and started the dead daemon of the prepared claim again, on the same pipe directory.
        revived = read_pid(_claim_dirs(h, killed)["pipe"])
        assert revived != killed_pid and daemon_alive(revived)
        killed_record = h.plugins[NODE].checkpoint.get(killed)
        assert killed_record is not None and killed_record.mps is not None and killed_record.mps.pid == revived
        kubelet = h.kubelet(NODE, previous=first)
        assert kubelet.prepare([("default", "mps-restart", uid)])[uid] == result
        # One start per claim plus the revival: the live daemon was not started twice.
        assert len([e for e in events(record) if e["kind"] == "start"]) == 4
        assert daemon_alive(pid)
        assert kubelet.unprepare([("default", "mps-killed", killed)]) == {killed: ""}
        assert not daemon_alive(revived) and not os.path.exists(_claim_dirs(h, killed)["root"])

        assert kubelet.unprepare([("default", "mps-restart", uid)]) == {uid: ""}
        assert not daemon_alive(pid)
        assert not os.path.exists(_claim_dirs(h, uid)["root"])


def test_without_private_shm_the_daemon_keeps_the_plugins_dev_shm_and_the_spec_leaves_it_alone(
        fake_on_path: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    record = fake_on_path["record"]
    monkeypatch.setenv("MPS_PRIVATE_SHM", "false")  # a plugin without CAP_SYS_ADMIN
    with PluginHarness() as h:
        h.start_plugin(NODE, "sim:8xh100")
        uid = h.create_claim("mps-shared-shm", [("gpu", NODE, "gpu-0")], config=[_mps()])
        assert h.kubelet(NODE).prepare([("default", "mps-shared-shm", uid)])[uid].ok
        daemon = next(e for e in events(record) if e["kind"] == "daemon")
        assert os.path.exists(os.path.join("/dev/shm", daemon["shm_marker"]))
        assert not os.path.exists(_claim_dirs(h, uid)["shm"])
        mounts = h.read_spec(NODE, uid)["devices"][0]["containerEdits"]["mounts"]
        assert [m["containerPath"] for m in mounts] == [_claim_dirs(h, uid)["pipe"]]
        assert h.kubelet(NODE).unprepare([("default", "mps-shared-shm", uid)]) == {uid: ""}
        assert not daemon_alive(daemon["pid"])
        assert not os.path.exists(os.path.join("/dev/shm", daemon["shm_marker"]))


@pytest.mark.usefixtures("fake_on_path")
def test_a_running_plugin_restarts_a_claims_daemon_that_died(monkeypatch: pytest.MonkeyPatch) -> None:
    """During a rolling update the old plugin's container takes its daemons along; the new plugin,
    already running, must bring them back without a restart of its own."""
    from kubelet_plugin.daemon import KubeletPlugin

    monkeypatch.setattr(KubeletPlugin, "mps_watch_interval_s", 0.2)
    with PluginHarness() as h:
        h.start_plugin(NODE, "sim:8xh100")
        uid = h.create_claim("mps-watch", [("gpu", NODE, "gpu-0")], config=[_mps(40, None)])
        assert h.kubelet(NODE).prepare([("default", "mps-watch", uid)])[uid].ok
        pipe = _claim_dirs(h, uid)["pipe"]
        pid = read_pid(pipe)
        assert pid is not None and daemon_alive(pid)
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 20

        def recorded_pid() -> int | None:
            record_now = h.plugins[NODE].checkpoint.get(uid)
            return record_now.mps.pid if record_now is not None and record_now.mps is not None else None

        # Revived: a new live daemon, and the checkpoint records it (the PID file comes first).
        while ((revived := read_pid(pipe)) in (None, pid) or not daemon_alive(revived)
               or recorded_pid() != revived):
            assert time.monotonic() < deadline, \
                f"the plugin never restarted the claim's MPS daemon (file {revived}, record {recorded_pid()})"
            time.sleep(0.1)
        assert h.kubelet(NODE).unprepare([("default", "mps-watch", uid)]) == {uid: ""}
        assert not daemon_alive(revived)


def test_uids_alike_in_their_first_16_characters_get_different_dirs_and_never_stop_each_others_daemon(
        h: PluginHarness, fake: dict[str, str]) -> None:
    uid = h.create_claim("mps-alike", [("gpu", NODE, "gpu-2")], config=[_mps()])
    kubelet = h.kubelet(NODE)
    assert kubelet.prepare([("default", "mps-alike", uid)])[uid].ok
    pid = read_pid(_claim_dirs(h, uid)["pipe"])
    assert pid is not None and daemon_alive(pid)
    # Same first 16 alphanumerics (case aside), another claim: never prepared here.
    alike = uid[:18].upper() + "-0000-000000000000"
    assert claim_dir_name(alike) != claim_dir_name(uid)
    assert kubelet.unprepare([("default", "other", alike)]) == {alike: ""}
    assert daemon_alive(pid) and os.path.isdir(_claim_dirs(h, uid)["root"])
    # A directory under the other UID's name that names another owner is left alone too.
    squatted = _claim_dirs(h, alike)["root"]
    os.makedirs(squatted)
    with open(os.path.join(squatted, "owner"), "w") as f:
        f.write(uid)
    assert kubelet.unprepare([("default", "other", alike)]) == {alike: ""}
    assert os.path.isdir(squatted)
    with open(os.path.join(_claim_dirs(h, uid)["root"], "owner")) as f:
        assert f.read() == uid  # prepare wrote the owner
    assert kubelet.unprepare([("default", "mps-alike", uid)]) == {uid: ""}
    assert not daemon_alive(pid)


def test_a_recorded_pid_that_is_not_this_claims_daemon_is_never_signalled(tmp_path: Any) -> None:
    from kubelet_plugin.checkpoint.records import MpsRecord

    # A process that merely mentions the name, and one named like the daemon serving another pipe dir.
    mentions = subprocess.Popen(["sh", "-c", "sleep 30", "nvidia-cuda-mps-control"])
    named = tmp_path / "nvidia-cuda-mps-control"
    named.symlink_to(shutil.which("sleep") or "/bin/sleep")
    impostor = subprocess.Popen([str(named), "30"], env={"CUDA_MPS_PIPE_DIRECTORY": str(tmp_path / "elsewhere")})
    try:
        for proc in (mentions, impostor):
            root = tmp_path / f"claim-{proc.pid}"
            (root / "pipe").mkdir(parents=True)
            record = MpsRecord(root=str(root), pipe_dir=str(root / "pipe"), log_dir=str(root / "log"),
                               device_uuids=[], pid=proc.pid)
            MpsControl(MpsControlSettings(binary="/nonexistent", stop_timeout=0.5, node=NODE)).stop(record)
            assert proc.poll() is None, f"{proc.args} was signalled"
    finally:
        for proc in (mentions, impostor):
            proc.kill()
            proc.wait()


def _zombie_children() -> list[str]:
    me = str(os.getpid())
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    text = f.read()
            except OSError:
                continue
            state, ppid = text[text.rfind(")") + 2:].split()[:2]
            if state == "Z" and ppid == me:
                found.append(f"{entry} {text[text.find('(') + 1:text.rfind(')')]}")
    return found


def _zombie_or_alive(pid: int) -> str:
    """The process state letter of ``pid`` (``Z`` for a zombie), or "" once it is gone entirely."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except FileNotFoundError:
        return ""
    return text[text.rfind(")") + 2:].split()[0]


@pytest.mark.skipif(os.geteuid() != 0, reason="switching to another user and a private /dev/shm need root")
def test_daemon_dirs_serve_any_user_and_a_stopped_daemon_is_reaped_not_left_a_zombie(
        fake_on_path: dict[str, str], tmp_path: Any) -> None:
    """Pods run as non-root users, and MPS starts each server as its client's user, so a uid-1000 client
    must be able to use the claim's pipe, log and shm directories. In the DaemonSet the plugin is its
    container's PID 1, so a daemonized control daemon becomes its child: stop must collect it."""
    import ctypes

    from kubelet_plugin.mps.mps_dirs import MpsBase, plan_record, write_owner

    libc = ctypes.CDLL(None, use_errno=True)
    pr_set_child_subreaper = 36
    assert libc.prctl(pr_set_child_subreaper, 1, 0, 0, 0) == 0  # stand in for PID 1: orphans come to us
    try:
        # Like /run/gpuready/mps: reachable by every user (pytest's own tmp dirs are 0700), and short
        # (the daemon's sockets live below it: 108 bytes at most).
        base = tempfile.mkdtemp(prefix="mps-", dir="/tmp")
        os.chmod(base, 0o755)
        record = plan_record(MpsBase(base), "uid-multi-user", private_shm=True)
        write_owner(record, "uid-multi-user")
        mps = MpsControl(MpsControlSettings(start_timeout=5.0, stop_timeout=3.0, node=NODE))
        started = mps.start(replace(record, device_uuids=["GPU-a"]))
        for path in (started.pipe_dir, started.log_dir, started.shm_dir):
            mode = os.stat(path).st_mode & 0o7777
            assert mode == 0o1777, f"{path} is {oct(mode)}: a non-root MPS server or client cannot use it"
        child = os.fork()
        if child == 0:  # as uid/gid 1000, what an MPS server and client do in these directories
            code = 1
            try:
                os.setgid(1000)
                os.setuid(1000)
                for path in (started.pipe_dir, started.log_dir, started.shm_dir):
                    with open(os.path.join(path, "written-by-1000"), "w") as f:
                        f.write("x")
                code = 0
            finally:
                os._exit(code)
        _, status = os.waitpid(child, 0)
        assert os.waitstatus_to_exitcode(status) == 0, "uid 1000 could not write into the claim's MPS dirs"
        assert started.pid is not None and _zombie_or_alive(started.pid) not in ("", "Z")
        mps.stop(started)
        assert _zombie_or_alive(started.pid) == "", "the stopped daemon is left as a zombie of the plugin"
        # -d daemonizes through an intermediate process, which also ends up ours: none may stay a zombie.
        assert _zombie_children() == [], "MPS processes left as zombies of the plugin"
        assert not os.path.exists(record.root)
    finally:
        libc.prctl(pr_set_child_subreaper, 0, 0, 0, 0)
        shutil.rmtree(base, ignore_errors=True)


def test_a_shares_memory_becomes_its_daemons_pinned_limit_when_the_claim_sets_none(
        h: PluginHarness, fake: dict[str, str]) -> None:
    """A 20 GiB share of a GPU with MPS and no explicit limit: the daemon enforces the 20 GiB it asked for
    (an allocation past it fails in the container), instead of letting it take the whole GPU."""
    share = {"request": "gpu", "driver": "gpu.nvidia.com", "pool": NODE, "device": "gpu-2",
             "shareID": "9c3f4a2e-1b5d-4e6f-8a7b-0c1d2e3f4a5b", "consumedCapacity": {"memory": "20Gi"}}
    uid = h.create_claim("mps-share", [], config=[_mps(pct=None, limit=None)], extra_results=[share])
    gpu2 = gpu_named(h.plugins[NODE].inventory.current().devices, "gpu-2")
    kubelet = h.kubelet(NODE)
    result = kubelet.prepare([("default", "mps-share", uid)])[uid]
    assert result.ok, result.error
    commands = [e["command"] for e in events(fake["record"]) if e["kind"] == "command"]
    assert commands == [f"set_default_device_pinned_mem_limit {gpu2.uuid} 20480M"]
    assert kubelet.unprepare([("default", "mps-share", uid)]) == {uid: ""}


def test_the_daemon_runs_multi_user_when_the_driver_offers_it(fake_on_path: dict[str, str], tmp_path: Any,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Two containers of one claim running as different users share one daemon only in multi-user mode."""
    from kubelet_plugin.mps.mps_dirs import MpsBase, plan_record

    base = tempfile.mkdtemp(prefix="mps-", dir="/tmp")
    try:
        for offered, env, expected in ((False, "", ["-d"]), (True, "", ["-d", "-M"]), (True, "false", ["-d"])):
            monkeypatch.setenv("FAKE_MPS_MULTIUSER", "1" if offered else "")
            monkeypatch.setenv("MPS_MULTIUSER", env or "true")
            mps = MpsControl(MpsControlSettings(start_timeout=5.0, stop_timeout=3.0, node=NODE))
            record = replace(plan_record(MpsBase(base), f"uid-{offered}-{env}", private_shm=False),
                             device_uuids=["GPU-a"])
            started = mps.start(record)
            mps.stop(started)
            starts = [e for e in events(fake_on_path["record"]) if e["kind"] == "start"]
            assert starts[-1]["argv"] == expected, (offered, env)
    finally:
        shutil.rmtree(base, ignore_errors=True)
