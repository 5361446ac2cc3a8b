#!/usr/bin/env bash
# Runs the real-GPU end-to-end suite (tests/gpu_e2e, marker gpu_e2e) on the GPU machine, from what
# pack-gpu-node.sh packed here: a real cluster on that machine (host network, no controller-manager),
# gpuready's plugin on the real NVML, pods computing through its CDI spec.
#   gpu-node.sh unpack-a    with .gpu-bundle-a carried: unpack it into $STAGE (kept while the machine is held)
#   gpu-node.sh run         with .gpu-bundle-b carried, right after: unpack it, install the wheels, run
# Writes under $OUT: gpu-e2e.log, gpu-e2e-report.jsonl (figures), nvidia-smi before/after, cluster logs.
# Never changes the GPU's settings: the suite reads them before and after and fails if they differ.
set -uo pipefail
cd "$(dirname "$0")/../.."
STAGE=${GPUREADY_GPU_STAGE:-/opt/gpuready-gpu-node}
OUT=${OUT:-/tmp/gpu-node-out}
mkdir -p "$STAGE" "$OUT"
unpack() { xz -dc "$1" | tar -x -C "$STAGE" || { echo "gpu-node: cannot unpack $1" >&2; exit 2; }; }
case "${1:-run}" in
  unpack-a) unpack .gpu-bundle-a/k8s-a.tar.xz; ls -la "$STAGE/bin"; exit 0 ;;
  run) [ -x "$STAGE/bin/kube-apiserver" ] || { echo "gpu-node: part a is not unpacked: run 'gpu-node.sh unpack-a' first, with .gpu-bundle-a carried" >&2; exit 2; }
       unpack .gpu-bundle-b/k8s-b.tar.xz ;;
  *) echo "usage: gpu-node.sh unpack-a|run" >&2; exit 2 ;;
esac
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  .gpu-bundle-b/wheels/*.whl || exit 2
export PYTHONPATH=/tmp/site:$PWD PATH=$STAGE/bin:$PATH GPUREADY_K8S_BIN=$STAGE/bin GPUREADY_IMAGE_CACHE=$STAGE/images
export GPUREADY_CUDA_CHECK_ARCHIVES="debian=$STAGE/images/cuda-check-debian.tar,lib64=$STAGE/images/cuda-check-lib64.tar"
export GPUREADY_GPU_E2E_REPORT=$OUT/gpu-e2e-report.jsonl GPUREADY_E2E_KEEP=1 PYTHONUNBUFFERED=1
nvidia-smi >"$OUT/nvidia-smi-before.txt" 2>&1
# Each test has its own limit, and the whole run one under the call's, so a hang still leaves the
# summary, the report and the cluster's logs (kept: GPUREADY_E2E_KEEP) to read.
timeout "${GPU_E2E_LIMIT:-480}" python3 -m pytest tests/gpu_e2e -m gpu_e2e -n 0 -v -rs --tb=short \
  --timeout "${GPU_E2E_TEST_LIMIT:-150}" -p no:cacheprovider ${GPU_E2E_ARGS:-} 2>&1 | tee "$OUT/gpu-e2e.log"
rc=${PIPESTATUS[0]}
nvidia-smi >"$OUT/nvidia-smi-after.txt" 2>&1
tar -czf "$OUT/cluster-logs.tar.gz" /tmp/gre2e-*/logs /tmp/gre2e-*/cdi 2>/dev/null
exit "$rc"
