"""The ``gpuready`` command: one entry point, one subcommand per job.

Each subcommand lives in its own module, which provides::

    HELP: str                                  # one line for ``gpuready --help``
    DESCRIPTION: str                           # what it does and what it needs
    def add_arguments(parser: argparse.ArgumentParser) -> None
    def run(args: argparse.Namespace) -> int   # exit status

Modules are imported only when their subcommand runs, so ``gpuready --help`` stays fast and a
missing optional dependency of one subcommand does not break the others.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from dra_driver import __version__
from dra_driver.logs import configure

# name -> module implementing it. Order is the order shown in --help.
SUBCOMMANDS: dict[str, str] = {
    "demo": "dra_driver.demo.command",
    "kubelet-plugin": "kubelet_plugin.command",
    "controller": "controller.command",
    "devices": "dra_driver.nvml.command",
    "validate": "dra_driver.health.validate_command",
    "local-apiserver": "dra_driver.apiserver.command",
    "explain": "controller.explain_command",
    "plan": "controller.plan_command",
}


def build_parser() -> argparse.ArgumentParser:
    """Build the top-level parser with every subcommand's arguments."""
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
    for name, module_name in SUBCOMMANDS.items():
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            # A subcommand whose module cannot be imported is shown, with the reason, not hidden.
            p = sub.add_parser(name, help=f"(unavailable: {exc})")
            p.set_defaults(_unavailable=str(exc))
            continue
        p = sub.add_parser(
            name,
            help=module.HELP,
            description=module.DESCRIPTION,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        module.add_arguments(p)
        p.set_defaults(_run=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``gpuready`` console script."""
    parser = build_parser()
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
