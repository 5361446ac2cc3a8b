#!/usr/bin/env bash
# Builds the gpuready image without any registry or Docker engine: a Debian base made with
# mmdebstrap from Debian's packages, then deploy/image/'s recipe (the Dockerfile's) run in it, written
# as an OCI archive that `ctr images import` takes. Cached by content in ~/.cache/gpuready/k8s/images
# (a hash of the Debian packages and versions, the wheels and the recipe): warm, a few seconds.
#
#   testbed/realcluster/build-image.sh [--testbed]
#
# --testbed: the TEST ONLY tag (registry.local/gpuready:<version>-testbed) with the testbed's
# simulated NVML, for GPU-less nodes. Prints the archive's path on its last line. Needs root,
# mmdebstrap (install-host-deps.sh) and the project's Python (its venv, where pip is). Environment:
# GPUREADY_K8S_CACHE (default ~/.cache/gpuready/k8s), PYTHON (default python3).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cd "$here/../.."
command -v mmdebstrap >/dev/null || { echo "build-image: mmdebstrap missing: run $here/install-host-deps.sh" >&2; exit 1; }
exec "${PYTHON:-python3}" -m testbed.realcluster.gpuready_image "$@"
