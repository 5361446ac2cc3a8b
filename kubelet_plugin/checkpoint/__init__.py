"""The crash-safe record of what this node prepared.

:mod:`.records` is what the file holds (pure): the record types and their strict JSON; :mod:`.store` is
the file itself (its bytes: version, checksum, one decoder per version; in-place and atomic writes, a
lock shared by plugin instances); :mod:`.salvage` what survives a corrupt file. The start-up
reconciliation with the node's CDI specs and MIG instances is the preparer's
(:mod:`kubelet_plugin.prepare.recovery`).
"""
