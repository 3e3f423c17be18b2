"""Free loopback ports for tests that start Ray processes by hand (``ray start``)."""

from __future__ import annotations

import socket


def free_ports(count: int) -> list[int]:
    """Ports free right now (bound together, so distinct). Ray binds them a moment later: a small
    race with other processes, acceptable in tests and far better than Ray's fixed defaults."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()
