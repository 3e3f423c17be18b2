"""CUDA IPC itself, for the ``"cuda_ipc"`` transport: no Ray, torch imported only where needed.

Colocated trainer and rollout workers (one GPU, or GPUs of one node) need not send weights through
host memory or a collective at all: the sender packs each bucket into a flat uint8 buffer on its
GPU and shares it with CUDA IPC (``torch.multiprocessing.reductions.reduce_tensor`` gives a small
picklable ``(rebuild, args)`` handle); the handle goes to the receivers through Ray like any small
object; each receiver maps it (``cudaIpcOpenMemHandle``: no copy), copies it into its own shadow
bucket on its own device, and drops the mapping.

Here: what a process's CUDA can do (``cuda_info``) and what would make a pairing fail
(``ipc_problems``, ``node_problems``, at ``WeightSync`` construction); sharing, rewriting and
opening handles; the sender's live buckets (``LiveBuckets`` refuses a third); the pinned host
staging buffer checksums go through (``host_staging``: one per process).

CUDA IPC works only between processes of one node, that can both see the GPU the memory is on,
and never within one process.
"""

import functools
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from rlinfra.placement.errors import short_ranks
from rlinfra.services.weights.buckets import BucketSpec, checksum, pack_torch

# The positions of the device index in ``rebuild_cuda_tensor``'s arguments (torch 2.x), and how
# many arguments it takes: checked before rewriting, so that a change in torch fails loudly.
_DEVICE_ARG = 6
_REBUILD_ARGS = 15
MAX_LIVE_BUCKETS = 2


@dataclass(frozen=True)
class CudaInfo:
    """What a worker reports about its CUDA, to check an IPC pairing before any transfer."""

    available: bool
    reason: str = ""
    device_uuid: str | None = None  # of the device this process packs on / allocates on
    visible_uuids: tuple[str, ...] = ()  # every device the process can see, by local index
    pid: int = 0
    node_id: str = ""


@dataclass(frozen=True)
class IpcBucket:
    """One packed bucket, shared: the handle a receiver maps, and what it must map to."""

    index: int
    nbytes: int
    device_uuid: str
    rebuild: Callable[..., Any]
    args: tuple[Any, ...]


@dataclass
class LiveBuckets:
    """The packed buckets the sender keeps alive until every receiver has copied them.

    The sender must not free a bucket a receiver may still be mapping, and must not hold more than
    ``MAX_LIVE_BUCKETS`` at once, or memory is no longer bounded by the bucket size: a third bucket is
    refused (it would mean the driver asked for one before acknowledging the last-but-one).
    """

    live: dict[int, tuple[Any, int]] = field(default_factory=dict)
    peak_count: int = 0
    peak_bytes: int = 0

    def hold(self, index: int, buffer: Any, nbytes: int) -> None:
        if index in self.live:
            raise RuntimeError(f"bucket {index} is already shared")
        if len(self.live) >= MAX_LIVE_BUCKETS:
            raise RuntimeError(
                f"refusing to share bucket {index}: buckets {sorted(self.live)} are not acknowledged yet "
                f"and at most {MAX_LIVE_BUCKETS} may be alive at once"
            )
        self.live[index] = (buffer, nbytes)
        self.peak_count = max(self.peak_count, len(self.live))
        self.peak_bytes = max(self.peak_bytes, self.nbytes)

    def release_through(self, index: int) -> None:
        """Every receiver acknowledged buckets ``<= index``: free them."""
        self.live = {held: bucket for held, bucket in self.live.items() if held > index}

    def release_all(self) -> None:
        self.live.clear()

    @property
    def nbytes(self) -> int:
        return sum(nbytes for _, nbytes in self.live.values())

    def __len__(self) -> int:
        return len(self.live)


class HostStaging:
    """A reused pinned host buffer: checksums of GPU buckets without allocating per bucket."""

    _buffer: Any = None  # until the first checksum

    def checksum(self, device_buffer: Any) -> int:
        """xxh3 of ``device_buffer``'s bytes (a uint8 CUDA tensor); waits for the GPU work on it."""
        import torch

        size = device_buffer.numel()
        if self._buffer is None or self._buffer.numel() < size:
            self._buffer = None  # free the old one first: pinned memory is scarce
            self._buffer = torch.empty(size, dtype=torch.uint8, pin_memory=True)
        host = self._buffer[:size]
        host.copy_(device_buffer)  # synchronous into pinned memory: the bytes are there on return
        return checksum(host.numpy())


# This process's staging buffer (pinned memory is scarce: one, reused by every checksum), and the
# buckets it (a sender) has shared and keeps alive, with its peaks so far.
host_staging = functools.cache(HostStaging)
live_buckets = functools.cache(LiveBuckets)


# ------------------------------------------------------------------------------------ probing
def cuda_info(node_id: str = "") -> CudaInfo:
    """This process's CUDA as the IPC transport needs it; never raises (the reason says why not)."""
    pid = os.getpid()
    unavailable = functools.partial(CudaInfo, False, pid=pid, node_id=node_id)  # with the reason
    try:
        import torch
    except ImportError:
        return unavailable("torch is not installed")
    if torch.version.cuda is None and getattr(torch.version, "hip", None) is None:
        return unavailable(f"torch {torch.__version__} is built without CUDA")
    if not torch.cuda.is_available():
        visible_env = os.environ.get("CUDA_VISIBLE_DEVICES")
        return unavailable(f"torch.cuda.is_available() is False (CUDA_VISIBLE_DEVICES={visible_env!r})")
    visible = tuple(device_uuid(index) for index in range(torch.cuda.device_count()))
    return CudaInfo(True, "", visible[torch.cuda.current_device()], visible, pid, node_id)


def device_uuid(index: int) -> str:
    """A device's identity across processes: local indices differ with ``CUDA_VISIBLE_DEVICES``,
    the UUID does not."""
    import torch

    properties = torch.cuda.get_device_properties(index)
    uuid = getattr(properties, "uuid", None)
    if uuid is not None and str(uuid):
        return str(uuid)
    return f"pci:{getattr(properties, 'pci_domain_id', 0)}:{getattr(properties, 'pci_bus_id', index)}"


def node_problems(
    sender_node: str, receiver_nodes: Mapping[int, str], sender_name: str, receiver_name: str
) -> list[str]:
    """Receivers on another node than the sender, whom CUDA IPC cannot reach."""
    elsewhere = sorted(rank for rank, node in receiver_nodes.items() if node != sender_node)
    if not elsewhere:
        return []
    nodes = sorted({receiver_nodes[rank] for rank in elsewhere})
    listed = ", ".join(nodes[:3]) + (f", … ({len(nodes)} in all)" if len(nodes) > 3 else "")
    return [
        f"{receiver_name} rank(s) {short_ranks(elsewhere)} are on {listed}, not on the sender's "
        f"{sender_node} ({sender_name}); CUDA IPC only maps memory between processes of one node — "
        f"use transport='object_store' (or 'broadcast' over nccl) across nodes"
    ]


def ipc_problems(
    sender: CudaInfo, receivers: Mapping[int, CudaInfo], sender_name: str, receiver_name: str
) -> list[str]:
    """Everything that would make a CUDA IPC transfer from ``sender`` to ``receivers`` fail."""
    problems = [] if sender.available else [f"the sender ({sender_name}) has no usable CUDA: {sender.reason}"]
    by_reason: dict[str, list[int]] = {}
    blind, same = [], []
    for rank, info in sorted(receivers.items()):
        if not info.available:
            by_reason.setdefault(info.reason, []).append(rank)
        elif sender.available and sender.device_uuid not in info.visible_uuids:
            blind.append(rank)
        if (info.pid, info.node_id) == (sender.pid, sender.node_id):
            same.append(rank)
    for reason, ranks in by_reason.items():
        problems.append(f"{receiver_name} rank(s) {short_ranks(ranks)} have no usable CUDA: {reason}")
    if blind:
        problems.append(
            f"{receiver_name} rank(s) {short_ranks(blind)} cannot see the sender's GPU "
            f"{sender.device_uuid} (CUDA IPC maps memory on the GPU it was allocated on): colocate "
            f"them on that GPU, or launch them with isolate_accelerator=False"
        )
    if same:
        problems.append(
            f"{receiver_name} rank(s) {short_ranks(same)} run in the sender's own process (a fused "
            f"worker?): CUDA cannot map a process's memory into itself; hand the tensors over directly"
        )
    return problems


# ------------------------------------------------------------------------- sender / receiver
def share_bucket(
    state: Mapping[str, Any], spec: BucketSpec, staging: HostStaging
) -> tuple[Any, int, IpcBucket]:
    """Pack bucket ``spec`` into a fresh uint8 buffer on the current GPU and share it.

    Returns ``(buffer, checksum, handle)``; the caller keeps ``buffer`` alive until every receiver
    has copied it (torch also keeps a freed block from reuse while a receiver still maps it, but
    the protocol does not rely on that).
    """
    import torch
    from torch.multiprocessing.reductions import reduce_tensor

    device = torch.cuda.current_device()
    buffer = pack_torch(state, spec, torch.empty(spec.nbytes, dtype=torch.uint8, device=device))
    digest = staging.checksum(buffer)
    rebuild, args = reduce_tensor(buffer)
    return buffer, digest, IpcBucket(spec.index, spec.nbytes, device_uuid(device), rebuild, tuple(args))


def on_device(args: tuple[Any, ...], local_index: int) -> tuple[Any, ...]:
    """``rebuild_cuda_tensor``'s arguments with the device index the receiver knows the GPU by:
    the sender's index means another device when the two see different ``CUDA_VISIBLE_DEVICES``."""
    if len(args) != _REBUILD_ARGS or not isinstance(args[_DEVICE_ARG], int):
        raise RuntimeError(
            f"unexpected CUDA IPC handle layout ({len(args)} arguments; argument {_DEVICE_ARG} is "
            f"{type(args[_DEVICE_ARG]).__name__ if len(args) > _DEVICE_ARG else 'missing'}): this "
            f"torch's reduce_tensor differs from the one rlinfra's cuda_ipc transport was written for"
        )
    return (*args[:_DEVICE_ARG], local_index, *args[_DEVICE_ARG + 1 :])


def local_index(uuid: str, visible_uuids: tuple[str, ...] | list[str]) -> int:
    """The local index of device ``uuid`` among the visible ones; a clear error if not visible."""
    try:
        return list(visible_uuids).index(uuid)
    except ValueError:
        raise RuntimeError(
            f"the sender's GPU {uuid} is not visible in this process (visible: {list(visible_uuids)}, "
            f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r})"
        ) from None


def open_bucket(bucket: IpcBucket, visible_uuids: tuple[str, ...]) -> Any:
    """Map a shared bucket into this process (no copy). Drop the result as soon as it is copied:
    the mapping keeps the sender's memory from being reused."""
    args = on_device(bucket.args, local_index(bucket.device_uuid, visible_uuids))
    tensor = bucket.rebuild(*args)
    if tensor.numel() != bucket.nbytes or tensor.element_size() != 1:
        raise RuntimeError(
            f"bucket {bucket.index}: mapped {tensor.numel()} x {tensor.element_size()} bytes, "
            f"expected {bucket.nbytes} bytes"
        )
    return tensor
