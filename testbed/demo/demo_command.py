"""``gpuready demo``: run the whole driver on simulated GPUs and tell what happens, checking each step."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

from testbed.demo.output import (
    DemoFailure,
    Printer,
    Stopped,
    check_stop,
    request_stop,
    reset_stop,
    stop_signal,
)
from testbed.demo.scenarios import DEFAULT, SCENARIOS

DESCRIPTION = f"""\
Starts a local Kubernetes API server, two simulated GPU nodes (8 x H100 with static MIG; 4 x H200
with dynamic MIG and a shared GPU) each with the real kubelet plugin on real gRPC sockets, a
kubelet emulator per node, and the gpuready controller as the allocator. Then it shows, checking
each step: the published inventory; pods with claims placed by VRAM (15 GiB on a MIG slice, 70 GiB,
two GPUs on one node, a shared GPU) and one that cannot fit, with gpuready explain's answer;
NodePrepareResources producing CDI specs; a GPU fault withdrawing the device (timed), GPUReady,
Events and the claim's status; recovery; and pods finishing. No GPU, cluster or network is needed.

Exit status: 0 when every step showed what it should, 1 when one did not (the message says which
and the work directory with the component logs is kept), 2 for bad arguments, 130 (Ctrl-C, SIGINT) or
143 (SIGTERM) when stopped before the story ended. With --serve, Ctrl-C or SIGTERM after the story is
the way to stop it: 0. On a signal every component is stopped and the work directory removed (kept
with --keep), and one line says so.

Scenarios (--scenario): {", ".join(f"{name}{' (default)' if name == DEFAULT else ''}" for name in SCENARIOS)}.
  {chr(10).join(f"  {s.name:10} {s.title}" for s in SCENARIOS.values()).strip()}

Examples:
  gpuready demo
  gpuready demo --scenario gpu-lost
  gpuready demo --serve          # then: KUBECONFIG=<printed path> kubectl get resourceslices
                                 # or kubectl apply -f deploy/examples/mig-slice.yaml (it runs)
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``gpuready demo``."""
    parser.add_argument("--scenario", choices=sorted(SCENARIOS), default=DEFAULT,
                        help=f"which fault to inject (default {DEFAULT})")
    parser.add_argument("--serve", action="store_true",
                        help="after the story, keep the cluster running (kubectl, /metrics) until Ctrl-C or SIGTERM; "
                             "each node's kubelet then runs any pod bound to it")
    parser.add_argument("--quiet", action="store_true",
                        help="print only each step's result and the summary")
    parser.add_argument("--hold-down", type=float, default=1.0,
                        help="seconds a recovered GPU must stay healthy before it is published again "
                             "(default 1 for the demo; the plugin's default is 60)")
    parser.add_argument("--keep", action="store_true",
                        help="keep the work directory (CDI specs, checkpoints, logs) after the demo")


def _on_signal(signum: int, frame: FrameType | None) -> None:
    request_stop(signum)


@contextmanager
def _signals(handler: Callable[[int, FrameType | None], Any]) -> Iterator[None]:
    """SIGTERM and SIGINT handled by ``handler`` while inside; the previous handlers afterwards. A
    no-op off the main thread (signals go to it only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def run(args: argparse.Namespace) -> int:
    """Run the story; 0 when every step held, 1 when one did not, 130/143 when a signal stopped it."""
    from testbed.demo.cluster import DemoCluster

    if args.hold_down < 0:
        print("gpuready demo: --hold-down must not be negative", file=sys.stderr)
        return 2
    scenario = SCENARIOS[args.scenario]
    p = Printer(quiet=args.quiet, total_steps=8)
    p.title(f"gpuready demo: a DRA driver for NVIDIA GPUs, on simulated GPUs (scenario: {scenario.name})")
    cluster = DemoCluster(hold_down=args.hold_down)
    failed = False
    stopped_by = ""  # the signal's name, when one stopped the demo
    status = 0
    story_done = False
    reset_stop()
    with _signals(_on_signal):
        try:
            _story(p, cluster, args)
            check_stop()  # a signal that a library swallowed, with no wait after it to notice
            story_done = True
            if args.serve:
                stopped_by = _serve(p, cluster)
        except (Stopped, KeyboardInterrupt, Exception) as exc:
            signum = stop_signal()
            if signum is not None:  # whatever the signal turned into on its way here
                stopped_by = signal.Signals(signum).name
                status = 0 if story_done else 128 + signum  # --serve's way to stop, or the story cut short
            elif isinstance(exc, DemoFailure):
                p.fail(str(exc))
                failed, status = True, 1
            elif isinstance(exc, KeyboardInterrupt):  # SIGINT before the handler was in place
                stopped_by, status = "SIGINT", 128 + signal.SIGINT
            else:  # an unexpected error is a failed demo too: say what and where the logs are
                p.fail(f"unexpected error: {type(exc).__name__}: {exc}")
                failed, status = True, 1
        finally:
            # A second Ctrl-C or SIGTERM must not cut the cleanup short: noted, not acted on.
            with _signals(lambda signum, frame: None):
                keep = args.keep or (failed and bool(cluster.workdir))
                if keep and cluster.workdir:
                    p.info(f"  work directory kept: {cluster.workdir} (component logs: {cluster.log_path})")
                cluster.stop(keep_workdir=keep)
            if stopped_by:
                p.info(_stopped_line(stopped_by, cluster.workdir, keep))
    return status


def _stopped_line(signame: str, workdir: str, kept: bool) -> str:
    """The one line said after a signal, once the cleanup it describes is done."""
    if not workdir:
        where = "no work directory had been made"
    elif kept:
        where = f"the work directory {workdir} is kept (--keep)"
    elif os.path.exists(workdir):
        where = f"the work directory {workdir} could not be removed"
    else:
        where = f"the work directory {workdir} is removed"
    return f"stopped on {signame}: every component is stopped and {where}"


def _story(p: Printer, cluster: Any, args: argparse.Namespace) -> None:
    """The eight steps and the summary; raises DemoFailure when a step does not hold."""
    from testbed.demo.health_story import fault, finish, recover
    from testbed.demo.story import (
        StoryState,
        explain_unfit,
        place_pods,
        prepare,
        show_inventory,
        start_cluster,
    )

    scenario = SCENARIOS[args.scenario]
    started = time.monotonic()
    start_cluster(p, cluster, metrics=args.serve)
    inventory = show_inventory(p, cluster)
    state = StoryState()
    place_pods(p, cluster, inventory, state)
    explain_unfit(p, cluster, state)
    prepare(p, cluster, state)
    result = fault(p, cluster, state, scenario)
    recover(p, cluster, state, scenario, result)
    finish(p, cluster, state)
    p.summary(time.monotonic() - started)
    if result.withdrawn_ms is not None:
        p.info(f"  Withdrawal time ({scenario.name}): {result.withdrawn_ms:.0f} ms.")


def _serve(p: Printer, cluster: Any) -> str:
    """Keep everything running until Ctrl-C or SIGTERM, printing how to look at it; returns which."""
    from testbed.demo.cluster import DemoCluster

    assert isinstance(cluster, DemoCluster)
    urls = cluster.serve_metrics()
    cluster.run_pods()
    p.info("")
    p.info("The cluster keeps running (Ctrl-C to stop). Point kubectl at it:")
    p.info(f"  export KUBECONFIG={cluster.kubeconfig}")
    p.info("  kubectl get nodes,resourceslices,deviceclasses")
    p.info("  kubectl get resourceslices -o yaml | less")
    p.info("  kubectl apply -f deploy/examples/mig-slice.yaml   # each node's kubelet runs any pod bound to it")
    p.info(f"  gpuready explain <claim> --kubeconfig {cluster.kubeconfig}")
    p.info("Metrics (open in a browser or curl):")
    for name, url in urls:
        p.info(f"  {name:24} {url}")
    p.info(f"Component logs: {cluster.log_path}")
    try:
        while True:
            check_stop()
            time.sleep(0.5)
    except Stopped as exc:
        return str(exc)
