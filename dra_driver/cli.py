"""The ``gpuready`` command: one entry point, one subcommand per job.

Each subcommand lives in its own module, which provides::

    DESCRIPTION: str                           # what it does and what it needs
    def add_arguments(parser: argparse.ArgumentParser) -> None
    def run(args: argparse.Namespace) -> int   # exit status

Its one-line summary is not in the module but beside its name (:data:`SUBCOMMANDS`, or an
extension's entry point), so ``gpuready --help`` imports no subcommand and stays fast. A module is
imported only when its subcommand runs (or shows its help): a daemon carries only its own imports,
and a broken subcommand cannot break the others.

The production subcommands are listed here. Others come from installed distributions under the
entry-point group :data:`EXTENSION_GROUP`, each naming a ``(module, one-line help)`` pair: that is
how the testbed adds ``demo`` and ``local-apiserver`` without any production module importing it.
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
    "kubelet-plugin": ("kubelet_plugin.plugin_command", "run the node daemon (registration, prepare, CDI, slices, health)"),
    "controller": ("controller.controller_command", "run the cluster daemon (VRAM-aware placement, webhooks, claim health)"),
    "devices": ("kubelet_plugin.devices_command", "show the GPUs, MIG devices and placements NVML reports on this node"),
    "validate": ("kubelet_plugin.validate_command", "check that every GPU on this node is ready (driver, container side, CUDA)"),
    "explain": ("controller.explain_command", "say why a claim or pod's claim does or does not fit"),
    "plan": ("controller.plan_command", "show what the planner would allocate for a claim right now"),
}


EXTENSION_GROUP = "gpuready.commands"


def extension_commands() -> dict[str, tuple[str, str]]:
    """Subcommands that installed distributions add: name -> (module, one-line help)."""
    from importlib.metadata import entry_points

    found: dict[str, tuple[str, str]] = {}
    for ep in entry_points(group=EXTENSION_GROUP):
        if ep.name in SUBCOMMANDS:
            continue  # an extension never replaces a production subcommand
        try:
            module_name, help_line = ep.load()
        except ModuleNotFoundError as exc:
            if exc.name and ep.value.split(".")[0].split(":")[0] == exc.name.split(".")[0]:
                continue  # its package is not installed (the production image leaves the testbed out)
            found[ep.name] = (ep.value, f"(unavailable: {exc})")
            continue
        except Exception as exc:  # a broken extension is listed as such, never breaks the CLI
            found[ep.name] = (ep.value, f"(unavailable: {exc})")
            continue
        found[ep.name] = (str(module_name), str(help_line))
    return found


def all_commands() -> dict[str, tuple[str, str]]:
    """Every subcommand: extensions (the demo first, as the README starts with it), then production."""
    return {**extension_commands(), **SUBCOMMANDS}


def _chosen(argv: Sequence[str], commands: dict[str, tuple[str, str]]) -> str | None:
    """The subcommand named on the command line, if any."""
    return next((a for a in argv if a in commands), None)


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """Build the top-level parser.

    With ``argv``, only the subcommand it names is imported (what ``main`` does); with ``None``,
    every subcommand is loaded, so a caller can parse any command line with the result.
    """
    # Running a production subcommand (a daemon starting) needs no scan of installed distributions'
    # entry points: that scan is tens of milliseconds before the first ResourceSlice.
    builtin = _chosen(argv or (), SUBCOMMANDS)
    is_help = any(a in ("-h", "--help") for a in argv or ())
    commands = SUBCOMMANDS if builtin is not None and not is_help and argv is not None else all_commands()
    description = ("gpuready: a Kubernetes DRA driver for NVIDIA GPUs. It publishes only GPUs that pass "
                   "validation, withdraws a GPU the moment it turns unhealthy, and places claims by VRAM.")
    if "demo" in commands:  # the testbed's; the production image has none to point at
        description += " Run 'gpuready demo' to see the whole system on simulated GPUs."
    parser = argparse.ArgumentParser(prog="gpuready", description=description)
    parser.add_argument("--version", action="version", version=f"gpuready {__version__}")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    chosen = _chosen(argv or (), commands)
    for name, (module_name, help_line) in commands.items():
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
