"""Real NVML readings from an H200 (the H200 model is checked against them)."""
