"""The cluster daemon: VRAM-aware planning, admission webhooks, claim health reconciler, explain."""
