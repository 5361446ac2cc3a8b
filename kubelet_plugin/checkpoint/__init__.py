"""The crash-safe record of what this node prepared.

:mod:`.schema` is what the file holds (pure): the records, their strict JSON, and the file's bytes
(version, checksum, one decoder per version); :mod:`.store` is the file itself (atomic writes, a lock
shared by plugin instances); :mod:`.salvage` what survives a corrupt file. The start-up
reconciliation with the node's CDI specs and MIG instances is the preparer's
(:mod:`kubelet_plugin.prepare.recovery`).
"""
