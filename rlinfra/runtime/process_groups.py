"""Process groups, worker side: torch.distributed groups made inside a hosted worker, without port races.

After ``launch`` every rank knows ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT``, and
rank 0 holds a bound, listening socket on ``MASTER_PORT`` (``hold_port``). Rank 0 hands that very
socket to torch's ``TCPStore`` (``master_listen_fd``), so the port is never released and re-bound:
no other process on the node can take it in between, unlike the usual probe-a-free-port-then-bind.
Every listener binds the node's address as Ray knows it (``listen_on``: loopback for the embedded
Ray), never every interface; gloo's own sockets follow through ``GLOO_SOCKET_IFNAME``.

``init_process_group`` / ``destroy_process_group`` make and drop the group's default process group;
``join_cross_group`` / ``cross_group`` / ``leave_cross_group`` handle named groups spanning
components (trainer rank 0 + every rollout worker, to broadcast weights), kept apart from the
default group because torch allows one default group per process. Call them inside a worker
method, or let the driver's ``rlinfra.runtime.rendezvous`` call them through rlinfra's host
methods. This module is a leaf: it imports neither Ray nor the rest of the runtime.

torch is optional (``pip install rlinfra[torch]``): it is imported only when a process group is made.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import struct
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

DEFAULT_TIMEOUT_S = 60.0
_LISTEN_BACKLOG = 128

# One hosted worker per actor process, so these are process state: the worker-side functions are
# plain functions called from user code, and find what they need here.
_listen_address = "127.0.0.1"  # the node's address (see listen_on); loopback until told
_HELD: dict[int, socket.socket] = {}  # port → listening socket not yet handed to torch
_master_port: int | None = None  # the default group's port, held here on rank 0
_CROSS_PORTS: dict[str, int] = {}  # cross group name → the port reserved for it in this process
_CROSS_GROUPS: dict[str, CrossGroup] = {}  # cross groups this process has joined


_SIOCGIFADDR = 0x8915  # Linux ioctl: an interface's IPv4 address


def interface_of(address: str) -> str | None:
    """The network interface that carries IPv4 ``address`` (``lo`` for 127.0.0.1), or None."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        for _, name in socket.if_nameindex():
            request = struct.pack("256s", name.encode()[:15])
            try:
                answer = fcntl.ioctl(probe.fileno(), _SIOCGIFADDR, request)
            except OSError:  # an interface without an IPv4 address
                continue
            if socket.inet_ntoa(answer[20:24]) == address:
                return name
    return None


def listen_on(address: str) -> None:
    """Bind this process's listeners to ``address``, the node's address as Ray knows it: the
    rendezvous ports here, and gloo's pair sockets through ``GLOO_SOCKET_IFNAME`` (the interface
    carrying ``address``) unless the environment already names one."""
    global _listen_address
    _listen_address = address
    if not os.environ.get("GLOO_SOCKET_IFNAME"):
        interface = interface_of(address)
        if interface is not None:
            os.environ["GLOO_SOCKET_IFNAME"] = interface


def hold_port(held: int | None = None) -> int:
    """``held`` if this process still holds that port, else a free port newly bound on this node's
    address (``listen_on``): listened on until torch takes it over (``init_process_group``/
    ``join_cross_group``) or ``leave_cross_group`` closes it. Connections that arrive early wait in
    the backlog instead of being refused."""
    if held in _HELD:
        return held
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((_listen_address, 0))
    sock.listen(_LISTEN_BACKLOG)
    port = sock.getsockname()[1]
    _HELD[port] = sock
    return port


def reserve_master_port() -> tuple[str, int]:
    """Rank 0: the address and port the default process group will meet at, held (no
    probe-then-bind race) until its store takes the very socket over; the one still held, else a
    fresh one (a process group consumed the last)."""
    global _master_port
    _master_port = hold_port(_master_port)
    return _listen_address, _master_port


def set_master(address: str, port: int) -> None:
    """Where this process's default process group meets (``MASTER_ADDR``/``MASTER_PORT``)."""
    os.environ.update({"MASTER_ADDR": address, "MASTER_PORT": str(port)})


def _require_torch() -> Any:
    try:
        import torch
        import torch.distributed
    except ImportError as error:
        raise ImportError(
            "rlinfra's rendezvous needs torch.distributed: pip install rlinfra[torch]"
        ) from error
    return torch


def default_backend() -> str:
    """``nccl`` where this process sees a CUDA device, else ``gloo``."""
    return "nccl" if _require_torch().cuda.is_available() else "gloo"


def _env(name: str, kind: type = str) -> Any:
    """The launch-set variable ``name`` as ``kind`` (``str`` or ``int``)."""
    value = os.environ.get(name)
    if not value:
        raise RuntimeError(
            f"{name} is not set: init_process_group runs inside a worker launched by a WorkerGroup, "
            "which sets RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT"
        )
    try:
        return kind(value)
    except ValueError:
        raise RuntimeError(f"{name}={value!r} is not an integer") from None


def _tcp_store(address: str, port: int, rank: int, world_size: int, timeout: timedelta) -> Any:
    """The store every rank of a rendezvous meets in; rank 0 serves it on its held socket.

    torch owns a ``master_listen_fd`` once passed, and closes it even when the constructor raises
    (measured with torch 2.13, libuv and legacy servers alike): so the socket is detached, not
    closed, and the port goes straight from our listener to torch's. Without a held socket (a
    rendezvous outside rlinfra), rank 0 binds the port itself.
    """
    dist = _require_torch().distributed
    held = _HELD.pop(port, None) if rank == 0 else None
    fd = held.detach() if held is not None else None
    # torch's default wait_for_workers=True: rank 0's store returns once every rank has connected.
    return dist.TCPStore(address, port, world_size, is_master=rank == 0, timeout=timeout, master_listen_fd=fd)


def init_process_group(backend: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S) -> str:
    """Make this worker's default torch process group from the env ``launch`` set, and return the
    backend used (default: ``nccl`` with CUDA, else ``gloo``). Every rank must call it; each blocks
    until all have joined or ``timeout_s`` passes."""
    rank, world_size = _env("RANK", int), _env("WORLD_SIZE", int)
    backend = backend or default_backend()
    timeout = timedelta(seconds=timeout_s)
    store = _tcp_store(_env("MASTER_ADDR"), _env("MASTER_PORT", int), rank, world_size, timeout)
    dist = _require_torch().distributed
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=timeout)
    return backend


def destroy_process_group() -> None:
    """Tear down this worker's default process group (and with it rank 0's store and port)."""
    dist = _require_torch().distributed
    if dist.is_initialized():
        dist.destroy_process_group()


@dataclass
class CrossGroup:
    """This process's membership of a named cross-component group: collectives on a process group
    object of its own, never the default group (torch keeps one default group per process)."""

    name: str
    rank: int
    world_size: int
    backend: str
    process_group: Any = field(repr=False)
    store: Any = field(repr=False)  # kept alive: on rank 0 it is the server the others met at

    def broadcast(self, tensor: Any, src: int) -> Any:
        """Broadcast ``tensor`` in place from cross rank ``src``; returns it."""
        options = _require_torch().distributed.BroadcastOptions()
        options.rootRank = src
        self.process_group.broadcast([tensor], options).wait()
        return tensor

    def all_reduce(self, tensor: Any, op: Any = None) -> Any:
        """Reduce ``tensor`` in place over every member (default: sum); returns it."""
        dist = _require_torch().distributed
        options = dist.AllreduceOptions()
        options.reduceOp = dist.ReduceOp.SUM if op is None else op
        self.process_group.allreduce([tensor], options).wait()
        return tensor

    def barrier(self) -> None:
        self.process_group.barrier().wait()


def reserve_cross_port(name: str) -> tuple[str, int]:
    """Hold a port for cross group ``name`` here (its rank 0) and return the address and port;
    asking twice gives the same port."""
    if name in _CROSS_GROUPS:
        raise RuntimeError(f"this process is already in cross group {name!r}: leave it first")
    _CROSS_PORTS[name] = hold_port(_CROSS_PORTS.get(name))
    return _listen_address, _CROSS_PORTS[name]


def _new_backend(backend: str, store: Any, rank: int, world_size: int, timeout: timedelta) -> Any:
    dist = _require_torch().distributed
    if backend == "gloo":
        return dist.ProcessGroupGloo(store, rank, world_size, timeout)
    if backend == "nccl":
        nccl = getattr(dist, "ProcessGroupNCCL", None)
        if nccl is None:
            raise RuntimeError("this torch build has no NCCL: use backend='gloo' for this cross group")
        options = nccl.Options()
        options._timeout = timeout
        return nccl(store, rank, world_size, options)
    raise ValueError(f"cross groups support the 'gloo' and 'nccl' backends, not {backend!r}")


def join_cross_group(
    name: str,
    address: str,
    port: int,
    rank: int,
    world_size: int,
    backend: str | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> str:
    """Join cross group ``name`` as ``rank`` of ``world_size`` and return the backend used (the
    group itself is ``cross_group(name)``); blocks until every member joined (gloo connects at
    once; nccl connects at the first collective). Rank 0 serves the store on the port
    ``reserve_cross_port`` holds."""
    if name in _CROSS_GROUPS:
        raise RuntimeError(f"this process is already in cross group {name!r}: leave it first")
    backend = backend or default_backend()
    timeout = timedelta(seconds=timeout_s)
    store = _tcp_store(address, port, rank, world_size, timeout)
    process_group = _new_backend(backend, store, rank, world_size, timeout)
    _CROSS_PORTS.pop(name, None)
    _CROSS_GROUPS[name] = CrossGroup(name, rank, world_size, backend, process_group, store)
    return backend


def cross_group(name: str) -> CrossGroup:
    """This process's membership of cross group ``name`` (joined through ``bring_up_cross``)."""
    joined = _CROSS_GROUPS.get(name)
    if joined is None:
        known = ", ".join(sorted(_CROSS_GROUPS)) or "none"
        raise KeyError(f"this process is not in cross group {name!r} (joined: {known})")
    return joined


def leave_cross_group(name: str) -> None:
    """Leave cross group ``name`` and free its port; leaving a group not joined does nothing, so a
    driver may clean up after a failed bring-up without knowing who got how far."""
    port = _CROSS_PORTS.pop(name, None)
    if port in _HELD:
        _HELD.pop(port).close()
    joined = _CROSS_GROUPS.pop(name, None)
    if joined is not None:
        with contextlib.suppress(Exception):  # a backend without shutdown is freed with its object
            joined.process_group.shutdown()
