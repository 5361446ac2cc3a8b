"""Node profiles and GPU models of the simulated NVML (JSON data files)."""
