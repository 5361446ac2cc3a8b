#!/usr/bin/env bash
# The e2e suite on each Kubernetes minor the README claims: builds each version's binaries (cached by
# version in ~/.cache/gpuready/k8s; a cold build is 12+ min on 2 cores, run at nice 19) and runs
#   GPUREADY_K8S_BIN=<that version>:<etcd>:<containerd> python -m pytest -n 0 -m e2e tests/e2e
# against them, one version after another (one real cluster per machine). For each version it
# writes docs/e2e-runs/<date>-kubernetes-<version>.log: the feature gates the testbed passed (every
# driver gate the binary still lists, switched on; the rest are GA there), each test's outcome and
# pytest's summary line. The table in docs/install.md ("Kubernetes versions") is written from these.
#
#   testbed/realcluster/version-matrix.sh [VERSION...]    (default: v1.34.4 v1.35.4 v1.36.3 v1.37.2)
#
# Environment: GPUREADY_E2E_MODE (chart by default, like CI), MATRIX_OUT (default docs/e2e-runs),
# MATRIX_PYTEST_ARGS (more pytest arguments, e.g. "-k 'not image'"). Needs root, Go and the venv.
set -uo pipefail
cd "$(dirname "$0")/../.."

versions=("$@")
[ ${#versions[@]} -gt 0 ] || versions=(v1.34.4 v1.35.4 v1.36.3 v1.37.2)
out=${MATRIX_OUT:-docs/e2e-runs}
mkdir -p "$out"
python=${PYTHON:-python}
summary=()

for ver in "${versions[@]}"; do
  echo "== $ver: binaries" >&2
  if ! bins=$(nice -n 19 testbed/realcluster/build-binaries.sh "$ver" | tail -1); then
    summary+=("$ver: build failed"); continue
  fi
  # GPUREADY_K8S_BIN replaces the whole cache layout: the chart mode's helm must be named too.
  bins="$bins:$(dirname "$(testbed/realcluster/build-helm.sh | tail -1)")"
  log="$out/$(date +%Y-%m-%d)-kubernetes-$ver.log"
  apiserver="${bins%%:*}/kube-apiserver"
  {
    echo "# e2e suite on Kubernetes $ver (built from source by build-binaries.sh), mode ${GPUREADY_E2E_MODE:-chart}"
    echo "# $(date -u +%Y-%m-%dT%H:%MZ), $(nproc)-core machine, simulated NVML; command:"
    echo "#   GPUREADY_K8S_BIN=$bins $python -m pytest -n 0 --timeout 900 -m e2e tests/e2e ${MATRIX_PYTEST_ARGS:-}"
    "$python" - "$apiserver" <<'PY'
import sys
from testbed.realcluster.feature_gates import driver_gates
g = driver_gates(sys.argv[1])
print("# gates switched on (stage as the binary lists it): "
      + (", ".join(f"{k} ({v})" for k, v in sorted(g.settable.items())) or "none"))
print("# GA here (or unknown to this version): " + ", ".join(g.ga))
PY
  } >"$log"
  echo "== $ver: e2e suite (log: $log)" >&2
  start=$(date +%s)
  # shellcheck disable=SC2086
  GPUREADY_K8S_BIN="$bins" "$python" -m pytest -n 0 --timeout 900 -m e2e tests/e2e -q -rA -p no:cacheprovider \
    ${MATRIX_PYTEST_ARGS:-} >"$log.full" 2>&1
  rc=$?
  grep -E '^(PASSED|FAILED|ERROR|SKIPPED) ' "$log.full" | cut -c1-400 >>"$log"
  tail -1 "$log.full" >>"$log"
  echo "# exit code $rc, $(( $(date +%s) - start )) s; full output: $log.full (not committed)" >>"$log"
  summary+=("$ver: $(tail -2 "$log" | head -1)")
done
printf '%s\n' "${summary[@]}"
