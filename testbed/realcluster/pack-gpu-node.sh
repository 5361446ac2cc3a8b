#!/usr/bin/env bash
# Packs what gpu-node.sh needs on the GPU machine, which has no network, into two ignored folders of
# the checkout, each under the 64 MiB that one call to that machine carries:
#   .gpu-bundle-a/  kube-apiserver, etcd, kube-scheduler, containerd and its shim (xz)
#   .gpu-bundle-b/  kubelet, ctr, runc, the CNI loopback plugin, busybox (xz);
#                   the pause and cuda-check images; the Python wheels gpuready needs beyond that
#                   machine's own packages (for CPython 3.12, manylinux x86_64)
# No kube-controller-manager or kubectl: the GPU suite runs without them (ClusterConfig.
# controller_manager=False), which keeps both parts small. Run here, in the venv, after
# prepare-host.sh; then carry .gpu-bundle-a in one call ("gpu-node.sh unpack-a") and .gpu-bundle-b in
# the next, right after (the machine keeps the first part only while it is held).
set -euo pipefail
cd "$(dirname "$0")/../.."
here=testbed/realcluster
IFS=: read -r -a dirs <<<"$("$here/build-binaries.sh" | tail -1)"
find_bin() { for d in "${dirs[@]}" /usr/sbin /usr/bin /usr/lib/cni /bin; do [ -x "$d/$1" ] && { echo "$d/$1"; return; }; done; echo "missing: $1" >&2; exit 1; }
rm -rf .gpu-bundle-a .gpu-bundle-b
mkdir -p .gpu-bundle-a .gpu-bundle-b/stage/bin .gpu-bundle-b/stage/images .gpu-bundle-b/wheels .gpu-bundle-a/stage/bin
for b in kube-apiserver etcd kube-scheduler containerd containerd-shim-runc-v2; do cp "$(find_bin "$b")" .gpu-bundle-a/stage/bin/; done
for b in kubelet ctr runc loopback; do cp "$(find_bin "$b")" .gpu-bundle-b/stage/bin/; done
cp "$(dpkg -L busybox-static | grep '/busybox$' | head -1)" .gpu-bundle-b/stage/bin/busybox
cache=${GPUREADY_IMAGE_CACHE:-$HOME/.cache/gpuready/k8s/images}
python - "$cache" .gpu-bundle-b/stage/images <<'PY'
import os, shutil, sys
from testbed.realcluster import cuda_images, images
cache, out = sys.argv[1], sys.argv[2]
go = shutil.which("go") or "/usr/local/go/bin/go"
shutil.copy(images.pause_archive(cache, go), out)  # same name there: the cluster finds it, needs no go
for layout in cuda_images.CUDA_CHECK_IMAGES:
    shutil.copy(cuda_images.cuda_check_archive(cache, layout), os.path.join(out, f"cuda-check-{layout}.tar"))
PY
python -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform manylinux_2_34_x86_64 \
  -d .gpu-bundle-b/wheels "kubernetes>=34" "grpcio>=1.85.1" "protobuf>=7.35.1" "cel-python>=0.5" "cryptography>=42" "msgspec>=0.18" PyYAML
# The kubernetes client's async half (aiohttp and its parts) is never imported by the sync client
# gpuready uses, and that machine has aiohttp anyway: leave it out to stay under the size a call carries.
rm -f .gpu-bundle-b/wheels/{aiohttp,aiohttp_retry,aiohappyeyeballs,aiosignal,frozenlist,multidict,propcache,yarl}-*.whl
tar -C .gpu-bundle-a/stage -cf - bin | xz -T0 -9 > .gpu-bundle-a/k8s-a.tar.xz
tar -C .gpu-bundle-b/stage -cf - bin images | xz -T0 -9 > .gpu-bundle-b/k8s-b.tar.xz
rm -rf .gpu-bundle-a/stage .gpu-bundle-b/stage
du -sh .gpu-bundle-a .gpu-bundle-b
