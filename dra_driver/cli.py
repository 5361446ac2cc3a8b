"""The ``gpuready`` command: one entry point, one subcommand per job.

Each subcommand lives in its own module, which provides::

    HELP: str                                  # its one-line summary
    DESCRIPTION: str                           # what it does and what it needs
    def add_arguments(parser: argparse.ArgumentParser) -> None
    def run(args: argparse.Namespace) -> int   # exit status

Modules are imported only when their subcommand runs (or shows its help), so ``gpuready --help``
stays fast, a daemon carries only its own imports, and a broken subcommand cannot break the others.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from dra_driver import __version__
from dra_driver.logs import configure

# name -> (module implementing it, one line for ``gpuready --help``). Order is the order shown.
# The one-line help lives here so that ``gpuready --help`` imports no subcommand, and running one
# subcommand imports only its own module (the node daemon should not carry the planner's CEL).
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("dra_driver.demo.command", "run the whole driver on simulated GPUs, end to end"),
    "kubelet-plugin": ("kubelet_plugin.command", "run the node daemon (registration, prepare, CDI, slices, health)"),
    "controller": ("controller.command", "run the cluster daemon (VRAM-aware placement, webhooks, claim health)"),
    "devices": ("dra_driver.nvml.command", "show the GPUs, MIG devices and placements NVML reports on this node"),
    "validate": ("dra_driver.health.validate_command", "check that every GPU on this node is ready (driver, container side, CUDA)"),
    "local-apiserver": ("dra_driver.apiserver.command", "run the local Kubernetes API server used by the tests and the demo"),
    "explain": ("controller.explain_command", "say why a claim or pod's claim does or does not fit"),
    "plan": ("controller.plan_command", "show what the planner would allocate for a claim right now"),
}


def _chosen(argv: Sequence[str]) -> str | None:
    """The subcommand named on the command line, if any."""
    return next((a for a in argv if a in SUBCOMMANDS), None)


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """Build the top-level parser.

    With ``argv``, only the subcommand it names is imported (what ``main`` does); with ``None``,
    every subcommand is loaded, so a caller can parse any command line with the result.
    """
    parser = argparse.ArgumentParser(
        prog="gpuready",
        description=(
            "gpuready: a Kubernetes DRA driver for NVIDIA GPUs. It publishes only GPUs that pass "
            "validation, withdraws a GPU the moment it turns unhealthy, and places claims by VRAM. "
            "Run 'gpuready demo' to see the whole system on simulated GPUs."
        ),
    )
    parser.add_argument("--version", action="version", version=f"gpuready {__version__}")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    chosen = _chosen(argv or ())
    for name, (module_name, help_line) in SUBCOMMANDS.items():
        if argv is not None and name != chosen:
            sub.add_parser(name, help=help_line)
            continue
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            # A subcommand whose module cannot be imported says why instead of vanishing.
            p = sub.add_parser(name, help=f"(unavailable: {exc})")
            p.set_defaults(_unavailable=str(exc))
            continue
        p = sub.add_parser(
            name,
            help=help_line,
            description=module.DESCRIPTION,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        module.add_arguments(p)
        p.set_defaults(_run=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``gpuready`` console script."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help()
        return 2
    if getattr(args, "_unavailable", None):
        print(f"gpuready {args.command}: unavailable: {args._unavailable}", file=sys.stderr)
        return 2
    configure(args.log_level)
    result: int = args._run(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
