#!/usr/bin/env bash
# Kubernetes' own DRA scheduling benchmark (scheduler_perf), run on this machine, so the fleet
# bench's pods per second (benchmarks/bench_fleet.py, docs/scale.md) can be set beside the figure
# Kubernetes publishes for the same scheduler code on the same hardware.
#
#   benchmarks/scheduler_perf_dra.sh [WORKLOAD] [KUBE_VERSION]
#     WORKLOAD      default SchedulingWithResourceClaimTemplate/5000pods_500nodes
#                   (500 nodes with DRA, 2,500 claims allocated first, 2,500 pods measured;
#                   perf-dash threshold 56 pods/s, "typically above 70" on Kubernetes' CI)
#     KUBE_VERSION  default v1.37.2, the version the rest of the testbed runs
#
# Needs the Go module of k8s.io/kubernetes that testbed/realcluster/build-binaries.sh already
# downloads (its go.mod under ~/.cache/gpuready/k8s/src) and the etcd it builds. The test binary is
# built once per version (a few minutes on 2 cores) and cached beside the binaries. Prints the
# throughput line (pods/s: average and percentiles) and leaves the full JSON in $OUT (default
# /tmp/scheduler-perf-dra). scheduler_perf runs the API server and the scheduler in one process
# over loopback, unlike bench_fleet's separate processes: the comparison says what that costs.
set -euo pipefail

WORKLOAD=${1:-SchedulingWithResourceClaimTemplate/5000pods_500nodes}
KUBE_VERSION=${2:-v1.37.2}
CACHE=${GPUREADY_K8S_CACHE:-$HOME/.cache/gpuready/k8s}
OUT=${OUT:-/tmp/scheduler-perf-dra}
src="$CACHE/src/kubernetes-$KUBE_VERSION"
bin="$CACHE/scheduler-perf-$KUBE_VERSION/dra.test"
etcd_dir=$(ls -d "$CACHE"/etcd-v* 2>/dev/null | sort -V | tail -1)
[ -f "$src/go.mod" ] || { echo "scheduler_perf_dra: no $src/go.mod; run testbed/realcluster/build-binaries.sh $KUBE_VERSION first" >&2; exit 2; }
[ -x "$etcd_dir/etcd" ] || { echo "scheduler_perf_dra: no etcd under $CACHE; run testbed/realcluster/build-binaries.sh first" >&2; exit 2; }

pkg=k8s.io/kubernetes/test/integration/scheduler_perf/dra
if [ ! -x "$bin" ]; then
  mkdir -p "$(dirname "$bin")"
  echo "scheduler_perf_dra: building $pkg test binary ($KUBE_VERSION)" >&2
  (cd "$src" && go test -c -o "$bin.partial" "$pkg") && mv "$bin.partial" "$bin"
fi
# The benchmark reads its workload files relative to its package folder (read-only in the module
# cache is fine: it writes only to -data-items-dir).
pkg_dir=$(cd "$src" && go list -f '{{.Dir}}' "$pkg")
rm -rf "$OUT"; mkdir -p "$OUT"
cd "$pkg_dir"
PATH="$etcd_dir:$PATH" "$bin" -test.run='^$' -test.bench="BenchmarkPerfScheduling/$WORKLOAD\$" -test.benchtime=1x \
  -test.timeout=30m -data-items-dir "$OUT" >"$OUT/log.txt" 2>&1 \
  || { tail -40 "$OUT/log.txt" >&2; exit 1; }
python3 - "$OUT" <<'PY'
import glob, json, sys
for path in glob.glob(f"{sys.argv[1]}/*.json"):
    for item in json.load(open(path))["dataItems"]:
        if item["labels"].get("Metric") == "SchedulingThroughput":
            d = item["data"]
            print(f"{item['labels']['Name']}: average {d['Average']:.1f} pods/s, p50 {d['Perc50']:.1f}, "
                  f"p90 {d['Perc90']:.1f}, p99 {d['Perc99']:.1f} (threshold {d.get('AverageThreshold', 'none')})")
PY
