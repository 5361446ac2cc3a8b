"""The crash-safe record of what this node prepared.

:mod:`.schema` is what a record holds and how it reads from JSON (pure dataclasses), :mod:`.codec`
the file's bytes (version, checksum, one decoder per version), :mod:`.store` the file itself (atomic
writes, a lock shared by plugin instances), :mod:`.salvage` what survives a corrupt file. The
start-up reconciliation with the node's CDI specs and MIG instances is the preparer's
(:mod:`kubelet_plugin.prepare.recovery`).
"""
