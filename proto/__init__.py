"""The kubelet gRPC APIs (plugin registration, DRA v1/v1beta1, DRA health v1alpha1/v1), generated from the .proto files beside them."""
