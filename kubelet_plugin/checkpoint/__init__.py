"""The crash-safe record of what this node prepared.

:mod:`.schema` is what a record holds (pure dataclasses), :mod:`.codec` the file's bytes (version,
checksum, one decoder per version), :mod:`.store` the file itself (atomic writes, a lock shared by
plugin instances), :mod:`.salvage` what survives a corrupt file, :mod:`.recovery` and
:mod:`.spec_recovery` the start-up reconciliation with the node's CDI specs and MIG instances.
"""
