#!/bin/sh
# Installs gpuready into the image: install.sh WHEEL_DIR
#
# WHEEL_DIR holds gpuready's own wheel and the wheels requirements.txt and build-requirements.txt
# pin. Run as root inside the image being built, after base.sh, by deploy/Dockerfile and by
# testbed/realcluster/build-image.sh alike. It writes under /usr/local only.
set -eu
umask 022
# No bytecode from imports: only compileall writes it, in the one form below (an import would
# leave timestamp-checked files that compileall then counts as done).
export PYTHONDONTWRITEBYTECODE=1
wheels=$1
recipe=$(cd "$(dirname "$0")" && pwd)
# pip runs from its wheel (a wheel is a zip, and pip's is runnable), so pip is never installed.
set -- "$wheels"/pip-*.whl
[ $# -eq 1 ] && [ -f "$1" ] || { echo "install.sh: want exactly one pip wheel in $wheels, found: $*" >&2; exit 1; }
pip="$1/pip"
export PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1 PIP_ROOT_USER_ACTION=ignore

# Exactly the pinned list, nothing resolved (--no-deps), from local wheels only; no bytecode yet
# (compiled below, reproducibly). --break-system-packages: this is the image's own python, and the
# packages go to /usr/local, where Debian's python looks for what its packages do not provide.
python3 "$pip" install --no-index --find-links "$wheels" --no-deps --no-compile --break-system-packages \
  -r "$recipe/requirements.txt" gpuready
site=$(python3 -c 'import os, dra_driver; print(os.path.dirname(os.path.dirname(dra_driver.__file__)))')
case "$site" in /usr/local/*) ;; *) echo "install.sh: gpuready went to $site, not under /usr/local" >&2; exit 1 ;; esac

# The asyncio client, never imported (requirements.txt says why its aiohttp is left out).
rm -rf "$site/kubernetes/aio"

# Every requirement is met but those requirements.txt leaves out on purpose: a new dependency
# that the pins forgot fails the build here, not the plugin at its first start on a node.
unmet=$(python3 "$pip" check 2>&1 | grep -v -E '^(kubernetes [^ ]+ requires (aiohttp|aiohttp-retry)|gpuready [^ ]+ requires cryptography), which is not installed\.$' || true)
if [ -n "$unmet" ]; then
  echo "install.sh: unmet requirements:" >&2
  echo "$unmet" >&2
  exit 1
fi

# Bytecode as base.sh makes it (unchecked hashes, fixed hash seed): reproducible, and a start
# imports without compiling.
PYTHONHASHSEED=0 python3 -m compileall -q -f -j 0 --invalidation-mode unchecked-hash "$site" >/dev/null

# Every native module of the wheels loads: a manylinux wheel takes some libraries from the system
# (grpcio, protobuf and google-re2 need libstdc++), and a base without one fails here, not a pod.
python3 - "$site" <<'PY'
import importlib, os, sys
site, broken = sys.argv[1], []
for top, dirs, files in sorted(os.walk(site)):
    for name in sorted(files):
        rel = os.path.relpath(os.path.join(top, name), site)
        if name.endswith(".so") and "." not in os.path.dirname(rel):  # skip vendored <pkg>.libs/
            module = rel.split(".", 1)[0].replace("/", ".")
            try:
                importlib.import_module(module)
            except Exception as exc:
                broken.append(f"{module}: {exc}")
if broken:
    sys.exit("install.sh: native modules that do not load:\n  " + "\n  ".join(broken))
PY

# The entrypoint starts, the daemons import, and they load from that bytecode: `python -v` names
# every source it has to compile instead ("code object from <file>.py").
gpuready --help >/dev/null
trace=/tmp/gpuready-import.log
if ! python3 -v -c 'import kubelet_plugin.plugin_command, kubelet_plugin.daemon, controller.controller_command, controller.daemon' 2>"$trace"; then
  grep -v '^#\|^import ' "$trace" | tail -20 >&2
  exit 1
fi
from_source=$(grep -E "^# code object from '?/.*\.py'?$" "$trace" || true)
rm -f "$trace"
if [ -n "$from_source" ]; then
  echo "install.sh: compiled at import, not from the image's bytecode:" >&2
  echo "$from_source" >&2
  exit 1
fi
