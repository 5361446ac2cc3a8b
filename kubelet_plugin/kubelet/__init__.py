"""The kubelet side of the node daemon, behind one seam (:class:`.helper.KubeletHelper`).

It owns everything that faces the kubelet, and the API server on the kubelet's behalf: plugin
registration (:mod:`.registration`), the DRA service (NodePrepare/Unprepare, v1 and v1beta1) and the
device health stream (v1 and v1alpha1) on the DRA socket (:mod:`.dra_service`, :mod:`.health_stream`,
:mod:`.grpc_loop`, :mod:`.sockets`), claim reads (:mod:`.claims`) and slice publishing with its
watch (:mod:`.slice_publisher`, :mod:`.slice_watch`, :mod:`.slice_diff`, :mod:`.slice_requests`).
The GPU driver behind it implements :class:`.driver.DraDriver` and never sees gRPC or the API server.
"""
