"""GPUReady gates the node: the readiness taint that keeps pods off a node until its GPUs are ready."""
