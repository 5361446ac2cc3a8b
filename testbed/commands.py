"""The testbed's ``gpuready`` subcommands, advertised to :mod:`dra_driver.cli` as entry points.

Each value is ``(module, one-line help)``; the module is imported only when its subcommand runs.
This module imports nothing, so listing the subcommands stays cheap.
"""

DEMO = ("testbed.demo.demo_command", "run the whole driver on simulated GPUs, end to end")
LOCAL_APISERVER = ("testbed.apiserver.apiserver_command",
                   "run the local Kubernetes API server used by the tests and the demo")
