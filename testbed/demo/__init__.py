"""``gpuready demo``: the whole driver on simulated GPUs, told as a short story.

A local API server, two simulated nodes, a real kubelet plugin per node (real gRPC over Unix
sockets, real CDI files, real checkpoint), the kubelet emulator registering and calling them, and
the real controller allocating claims. Modules:

* :mod:`~testbed.demo.output` - plain-text tables and the step printer (colour only on a TTY).
* :mod:`~testbed.demo.cluster` - starting and stopping the parts, and reading the cluster.
* :mod:`~testbed.demo.workloads` - the pods and claims of the story.
* :mod:`~testbed.demo.scenarios` - the scripted faults (``--scenario``).
* :mod:`~testbed.demo.story` - the steps, each checking what it shows.
* :mod:`~testbed.demo.demo_command` - the CLI subcommand.
"""
