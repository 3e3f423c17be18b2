"""Which TCP ports a tree of processes listens on, and on which address: read from ``/proc``.

``/proc/net/tcp*`` lists every listening socket with its inode; ``/proc/PID/fd`` links name the
inodes a process holds. Linux only, as the test machines are.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import threading
from dataclasses import dataclass
from pathlib import Path

_LISTEN = "0A"  # the TCP state code of a listening socket


@dataclass(frozen=True)
class Listener:
    pid: int
    command: str
    address: ipaddress.IPv4Address | ipaddress.IPv6Address
    port: int

    @property
    def on_loopback(self) -> bool:
        mapped = getattr(self.address, "ipv4_mapped", None)
        return (mapped or self.address).is_loopback

    def __str__(self) -> str:
        return f"{self.command}[{self.pid}] {self.address}:{self.port}"


def _address(hex_text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    raw = bytes.fromhex(hex_text)
    # The kernel prints each 32-bit word in host (little-endian) order.
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    return ipaddress.ip_address(words)


def _listening_sockets() -> dict[str, tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, int]]:
    """inode -> (address, port) of every listening TCP socket on this host."""
    found = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] != _LISTEN:
                continue
            address, port = fields[1].split(":")
            found[fields[9]] = (_address(address), int(port, 16))
    return found


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:  # gone meanwhile
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        tree.setdefault(parent, []).append(int(entry))
    return tree


def _kernel_lists_children() -> bool:
    """Whether the kernel keeps per-thread ``children`` lists (``CONFIG_PROC_CHILDREN``)."""
    return os.path.exists(f"/proc/self/task/{threading.get_native_id()}/children")


def _children_of(pid: int) -> list[int]:
    """``pid``'s children from its threads' ``children`` lists (a few files, where a scan of
    ``/proc`` reads one per process). A thread that ends between the listing and the read hands
    its children to another thread, perhaps one read already: the lists are read again until no
    thread ended meanwhile (20 reads at most). Taking that thread for a kernel without the lists
    lost all of Ray's driver's children now and then in CI: the driver's threads come and go."""
    for _ in range(20):
        try:
            threads = os.listdir(f"/proc/{pid}/task")
        except OSError:  # gone meanwhile
            return []
        children: list[int] = []
        for thread in threads:
            try:
                children += map(int, Path(f"/proc/{pid}/task/{thread}/children").read_text().split())
            except OSError:
                break
        else:
            return children
    return children


def descendants(root: int) -> set[int]:
    """``root`` and every process under it (nothing where there is no ``/proc``)."""
    if not os.path.isdir("/proc"):
        return set()
    children_of = _children_of if _kernel_lists_children() else _children().get
    found, todo = set(), [root]
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo.extend(children_of(pid) or [])
    return found


def listeners_of(pids: set[int]) -> list[Listener]:
    sockets = _listening_sockets()
    found = []
    for pid in sorted(pids):
        try:
            links = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
            command = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            continue
        for link in links:
            inode = link[len("socket:[") : -1] if link.startswith("socket:[") else None
            if inode in sockets:
                found.append(Listener(pid, command, *sockets[inode]))
    return found


def machine_address() -> str | None:
    """This host's address towards the network (no packet is sent), or None without one."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # TEST-NET-1: any routable address serves
        except OSError:
            return None
        address = probe.getsockname()[0]
    return None if ipaddress.ip_address(address).is_loopback else address
