"""The kubelet gRPC APIs (plugin registration, DRA v1/v1beta1, DRA health v1alpha1/v1), generated from the .proto files beside them.

Import as ``from proto import dra_v1_pb2, dra_v1_pb2_grpc``. The generated modules are committed;
after editing a ``.proto`` file run ``python proto/generate.py`` (``--check`` verifies they are current).
"""
