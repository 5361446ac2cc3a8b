"""Free TCP ports for daemons a test starts on this (shared) machine."""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on at ``host`` just now (the OS picks it; it is released at once)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
