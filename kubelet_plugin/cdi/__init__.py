"""CDI for prepared claims: :mod:`.cdi_spec` computes a claim's spec (pure), :mod:`.driver_files`
finds the driver's libraries and binaries to mount."""
