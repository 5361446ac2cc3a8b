"""containerd's configuration for the e2e node: everything under the cluster's directory.

CDI is on and reads the plugin's CDI directory; the sandbox image is the locally imported pause;
oom_score_adj is never lowered (these VMs refuse it); network namespaces are mounted under the
state dir so teardown finds them; runc keeps its state where teardown can kill what is left.
"""

from __future__ import annotations

import json


def render(*, root: str, state: str, socket: str, runc: str, runc_root: str, cdi_dir: str,
                       cni_bin: str, cni_conf: str, sandbox_image: str, opt_dir: str) -> str:
    """containerd 2.x configuration (version 3 schema), everything under the cluster's directory."""
    def q(s: str) -> str:
        return json.dumps(s)  # a TOML basic string is a JSON string for the paths used here

    return f"""version = 3
root = {q(root)}
state = {q(state)}
imports = []
disabled_plugins = ["io.containerd.nri.v1.nri", "io.containerd.tracing.processor.v1.otlp",
                    "io.containerd.internal.v1.tracing"]

[grpc]
  address = {q(socket)}

[ttrpc]
  address = {q(socket + ".ttrpc")}

[plugins."io.containerd.internal.v1.opt"]
  path = {q(opt_dir)}

[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = {q(sandbox_image)}

[plugins."io.containerd.cri.v1.runtime"]
  # The VM refuses lowering oom_score_adj; the kubelet asks -997/-998 for guaranteed pods and sandboxes.
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  enable_cdi = true
  cdi_spec_dirs = [{q(cdi_dir)}]
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = [{q(cni_bin)}]
    conf_dir = {q(cni_conf)}
    max_conf_num = 1
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        BinaryName = {q(runc)}
        Root = {q(runc_root)}
        SystemdCgroup = false

[plugins."io.containerd.grpc.v1.cri"]
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
"""
