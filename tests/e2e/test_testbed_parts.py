"""The testbed's own pure parts, checked without a cluster (no ``e2e`` marker: they run in the unit
suite too): the kubelet-metrics reader and the image tarballs."""

from __future__ import annotations

import hashlib
import json
import os
import tarfile

import e2e_support  # noqa: F401  (puts the repository on sys.path for testbed)

from testbed.realcluster import images
from testbed.realcluster.kubelet_metrics import Operation, grpc_operations

# Lines as kubelet v1.37.2 served them (buckets trimmed), plus another driver and a failed call.
KUBELET_METRICS = """\
# HELP dra_grpc_operations_duration_seconds [ALPHA] Duration in seconds of the DRA gRPC operations
# TYPE dra_grpc_operations_duration_seconds histogram
dra_grpc_operations_duration_seconds_bucket{driver_name="gpu.nvidia.com",grpc_status_code="OK",method_name="/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources",le="0.1"} 2
dra_grpc_operations_duration_seconds_bucket{driver_name="gpu.nvidia.com",grpc_status_code="OK",method_name="/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources",le="+Inf"} 2
dra_grpc_operations_duration_seconds_sum{driver_name="gpu.nvidia.com",grpc_status_code="OK",method_name="/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources"} 0.037793413
dra_grpc_operations_duration_seconds_count{driver_name="gpu.nvidia.com",grpc_status_code="OK",method_name="/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources"} 2
dra_grpc_operations_duration_seconds_sum{driver_name="gpu.nvidia.com",grpc_status_code="Unavailable",method_name="/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources"} 1.5
dra_grpc_operations_duration_seconds_count{driver_name="gpu.nvidia.com",grpc_status_code="Unavailable",method_name="/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources"} 1
dra_grpc_operations_duration_seconds_sum{driver_name="other.example.com",grpc_status_code="OK",method_name="/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources"} 9
dra_grpc_operations_duration_seconds_count{driver_name="other.example.com",grpc_status_code="OK",method_name="/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources"} 9
dra_grpc_operations_duration_seconds_sum{driver_name="gpu.nvidia.com",grpc_status_code="OK",method_name="/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodeUnprepareResources"} 0.01
dra_grpc_operations_duration_seconds_count{driver_name="gpu.nvidia.com",grpc_status_code="OK",method_name="/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodeUnprepareResources"} 2
"""


def test_kubelet_grpc_operations_are_counted_per_method_for_our_driver_and_status() -> None:
    ok = grpc_operations(KUBELET_METRICS)
    assert ok["NodePrepareResources"] == Operation(2, 0.037793413)
    assert ok["NodeUnprepareResources"] == Operation(2, 0.01)
    assert abs(ok["NodePrepareResources"].mean - 0.0189) < 1e-4
    every = grpc_operations(KUBELET_METRICS, status=None)
    assert every["NodePrepareResources"] == Operation(3, 1.537793413)
    assert (every["NodePrepareResources"] - ok["NodePrepareResources"]) == Operation(1, 1.5)


def test_image_tarball_is_an_oci_layout_named_for_containerd_and_reproducible(tmp_path: os.PathLike[str]) -> None:
    src = os.path.join(str(tmp_path), "hello")
    with open(src, "w") as f:
        f.write("#!/bin/sh\necho hi\n")
    entries = [images.FileEntry("bin", directory=True), images.FileEntry("bin/hello", source=src),
               images.FileEntry("bin/hi", link="hello")]
    one = images.oci_archive("registry.local/hello:1", entries, ["/bin/hello"], os.path.join(str(tmp_path), "a.tar"))
    two = images.oci_archive("registry.local/hello:1", entries, ["/bin/hello"], os.path.join(str(tmp_path), "b.tar"))
    with open(one, "rb") as a, open(two, "rb") as b:
        assert a.read() == b.read()
    with tarfile.open(one) as tar:
        index = json.load(tar.extractfile("index.json"))  # type: ignore[arg-type]
        desc = index["manifests"][0]
        assert desc["annotations"]["io.containerd.image.name"] == "registry.local/hello:1"
        manifest = json.load(tar.extractfile(f"blobs/sha256/{desc['digest'][7:]}"))  # type: ignore[arg-type]
        layer = tar.extractfile(f"blobs/sha256/{manifest['layers'][0]['digest'][7:]}").read()  # type: ignore[union-attr]
        config = json.load(tar.extractfile(f"blobs/sha256/{manifest['config']['digest'][7:]}"))  # type: ignore[arg-type]
    assert config["rootfs"]["diff_ids"] == ["sha256:" + hashlib.sha256(layer).hexdigest()]
    assert config["config"]["Entrypoint"] == ["/bin/hello"]
