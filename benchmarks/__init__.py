"""gpuready benchmarks: each module times one hot path; ``python -m benchmarks.run_all`` runs them all."""
