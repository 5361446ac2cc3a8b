"""The kubelet's gRPC interface: plugin registration, the DRA service (NodePrepare/Unprepare, v1 and
v1beta1), the device health stream (v1 and v1alpha1), and the Unix socket paths they listen on."""
