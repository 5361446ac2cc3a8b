#!/bin/sh
# TEST ONLY. Adds the testbed's simulated NVML to a gpuready image: add-testbed.sh SOURCE_TREE
#
# The production image leaves the testbed package out (production code never imports it), so
# `--nvml sim:<profile>` (the chart's nvml.source=simulated) has no backend there. A GPU-less
# node, such as the e2e suite's, runs the plugin from the test-only tag this makes instead
# (gpuready:<version>-testbed): the production layers plus testbed/__init__.py and
# testbed/nvml_sim/, which gpuready's installed entry point `sim = testbed.nvml_sim:backend` finds,
# testbed/crash_points.py, which the simulated NVML's fault channel arms for the e2e kill test,
# testbed/fake_driver_root.py, which its driver_reload fault uses to swap the driver's files, and
# testbed/simulated_node.py, which the chart's simulated.enabled runs to give the node a fake driver
# root and the device nodes CDI specs name.
# Only those: they need nothing but the standard library and gpuready itself, while the
# rest of the testbed (local API server, demo, real-cluster harness) has no place in a pod.
set -eu
umask 022
# No bytecode from imports: only compileall writes it, in the one form below (an import would
# leave timestamp-checked files that compileall then counts as done).
export PYTHONDONTWRITEBYTECODE=1
src=$1
site=$(python3 -c 'import os, dra_driver; print(os.path.dirname(os.path.dirname(dra_driver.__file__)))')
[ ! -e "$site/testbed" ] || { echo "add-testbed.sh: $site/testbed exists already" >&2; exit 1; }
mkdir -p "$site/testbed"
cp "$src/testbed/__init__.py" "$src/testbed/crash_points.py" "$src/testbed/fake_driver_root.py" "$site/testbed/"
cp "$src/testbed/simulated_node.py" "$site/testbed/"
cp -R "$src/testbed/nvml_sim" "$site/testbed/"
find "$site/testbed" -depth -type d -name __pycache__ -exec rm -rf {} +
find "$site/testbed" -exec chmod u=rwX,go=rX {} +
PYTHONHASHSEED=0 python3 -m compileall -q -f --invalidation-mode unchecked-hash "$site/testbed" >/dev/null
gpuready devices --nvml sim:4xh200 >/dev/null
