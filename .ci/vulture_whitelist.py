"""Names vulture reports as unused that are read by something other than our code (.ci/dead_code.py).

vulture matches by name, so each line below keeps every definition of that name alive: keep the list
to names a framework, a protocol or a file format reads, each group with the reason. Dead code is
removed, not listed here.
"""

from vulture.whitelist_utils import Whitelist

# http.server / socketserver call these hooks and read these class attributes: the health, metrics and
# webhook servers, the local API server and its handler.
http = Whitelist()
http.do_GET
http.do_POST
http.do_PUT
http.do_PATCH
http.do_DELETE
http.log_message
http.handle_error
http.protocol_version
http.server_version
http.disable_nagle_algorithm
http.close_connection
http.daemon_threads
http.allow_reuse_address
http.request_queue_size

# The context manager protocol passes __exit__ its three arguments, used or not. PEP 562: Python
# calls a module's __getattr__ for a name the module lacks (kubelet_plugin.metrics resolves its
# exports lazily).
protocols = Whitelist()
protocols.exc_type
protocols.__getattr__

# Entry points in pyproject.toml ([project.entry-points."gpuready.commands"]): importlib.metadata loads
# them by name.
testbed_commands = Whitelist()
testbed_commands.DEMO
testbed_commands.LOCAL_APISERVER

# Attributes other libraries read from objects we fill: kubernetes.client.Configuration, tarfile.TarInfo.
libraries = Whitelist()
libraries.connection_pool_maxsize
libraries.mtime
libraries.linkname

# The simulated NVML returns pynvml's own structs (nvmlPciInfo_t, c_nvmlFieldValue_t, the instance
# profile infos) and a stand-in for c_nvmlComputeInstanceInfo_t, filled as real NVML fills them: a
# field left unset would read as 0 for a future reader, with no error to say so.
nvml_structs = Whitelist()
nvml_structs.busIdLegacy
nvml_structs.pciDeviceId
nvml_structs.pciSubSystemId
nvml_structs.fieldId
nvml_structs.scopeId
nvml_structs.isP2pSupported
nvml_structs.sharedCopyEngineCount
nvml_structs.sharedDecoderCount
nvml_structs.sharedEncoderCount
nvml_structs.sharedJpegCount
nvml_structs.sharedOfaCount
nvml_structs.gpuInstance

# Data kept for the people who read it, through a generic reader. ClaimRecord.updated_at: a field of
# the on-disk checkpoint (schema.py writes and reads every dataclass field; a version-1 file has it).
# XidInfo.catalogue_action: NVIDIA's immediate action, beside each row's `application` decision so the
# table can be checked against the catalogue it was transcribed from.
data = Whitelist()
data.updated_at
data.catalogue_action
