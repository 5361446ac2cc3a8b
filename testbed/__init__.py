"""Everything that stands in for the outside world, and the demo built on it.

The local Kubernetes API server (:mod:`.apiserver`), the simulated NVML (:mod:`.nvml_sim`), the
kubelet emulator (:mod:`.kubelet_emulator`), real Kubernetes components for the end-to-end tests
(:mod:`.realcluster`), the demo (:mod:`.demo`), and the harnesses and samples tests share. Production
code never imports this package (``lint-imports`` enforces it); the testbed plugs into the
``gpuready`` command and the plugin's NVML through entry points (``pyproject.toml``).
"""
