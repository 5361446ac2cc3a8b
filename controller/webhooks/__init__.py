"""The admission webhooks: :mod:`.admission_decisions` decides (pure: VRAM shaping into a best-fit
``firstAvailable`` list, opaque-config validation), :mod:`.webhook_server` serves AdmissionReview
over HTTPS against the informers' inventory."""
