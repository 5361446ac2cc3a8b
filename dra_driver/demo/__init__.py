"""``gpuready demo``: the whole driver on simulated GPUs, told as a short story.

A local API server, two simulated nodes, a real kubelet plugin per node (real gRPC over Unix
sockets, real CDI files, real checkpoint), the kubelet emulator registering and calling them, and
the real controller allocating claims. Modules:

* :mod:`~dra_driver.demo.output` - plain-text tables and the step printer (colour only on a TTY).
* :mod:`~dra_driver.demo.cluster` - starting and stopping the parts, and reading the cluster.
* :mod:`~dra_driver.demo.workloads` - the pods and claims of the story.
* :mod:`~dra_driver.demo.scenarios` - the scripted faults (``--scenario``).
* :mod:`~dra_driver.demo.story` - the steps, each checking what it shows.
* :mod:`~dra_driver.demo.command` - the CLI subcommand.
"""
