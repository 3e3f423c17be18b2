"""The ``"cuda_ipc"`` transport: buckets packed on the sender's GPU and mapped, zero-copy, by
receivers on the same node; only the small handles go through Ray (``cuda_handles`` holds the CUDA
IPC pieces).

    per bucket i   sender    pack i on the GPU, checksum it, keep it alive, return the handle
                   receivers map i, copy into the shadow, checksum what landed, acknowledge
                   sender    free i when asked for bucket i + 2 (every receiver acknowledged i)

Memory beyond the two copies (the trainer's weights and each receiver's shadow): at most two
packed buckets on the sender's GPU (``LiveBuckets`` refuses a third), and one host staging
buffer of the bucket size in each process for checksums.

Checksums are xxh3 of the bytes, as for the other transports, so a corrupted or misrouted bucket
fails ``verify`` the same way. Hashing needs the bytes on the host: the sender copies every packed
bucket to the host once, and every receiver copies what landed in its shadow to the host once
(pinned staging buffer, reused). That is one device-to-host pass of the whole state per process,
plus xxh3 at host speed (about 10-30 GB/s per core), paid while generation goes on (prepare), not
while it is paused.

Checked at construction: checksums on, CUDA in every process, one node, the sender's GPU visible
to every receiver, no receiver in the sender's own process.
"""

import functools
from typing import Any

from rlinfra.runtime.group import WorkerGroup
from rlinfra.runtime.served_asleep import served_asleep
from rlinfra.services.weights.buckets import Manifest
from rlinfra.services.weights.buffers import Buffers
from rlinfra.services.weights.transports import cuda_handles
from rlinfra.services.weights.transports.base import ReceiverSide, SenderSide, Transport


class CudaBuffers(Buffers):
    """One version on this worker's current GPU: a torch uint8 tensor per bucket."""

    def new_bucket(self, nbytes: int) -> Any:
        import torch

        return torch.empty(nbytes, dtype=torch.uint8, device=torch.cuda.current_device())

    def digest(self, index: int) -> int:
        return cuda_handles.host_staging().checksum(self.buckets[index])


class CudaIpcTransport(Transport):
    """The driver: one handle in flight to the receivers, the next bucket being packed meanwhile."""

    shadow = CudaBuffers

    def check(self, checksums: bool) -> None:
        """Refuse, before any update, what CUDA IPC cannot do: updates without checksums, receivers
        on another node (from where Ray started each worker), then processes without CUDA,
        receivers that cannot see the sender's GPU, or a receiver in the sender's own process
        (asked of every worker)."""
        link = self.link
        self._refuse_unhashed(checksums)
        sender_name, receiver_name = f"{link.sender.name} rank {link.sender_rank}", link.receivers.name
        nodes = {rank: _node_of(link.receivers, rank) for rank in link.alive}
        sender_node = _node_of(link.sender, link.sender_rank)
        problems = cuda_handles.node_problems(sender_node, nodes, sender_name, receiver_name)
        if not problems:
            sender = link.on_sender(CudaIpcSide.weights_cuda_info)
            receivers = dict(zip(link.alive, link.on_receivers(CudaIpcSide.weights_cuda_info), strict=True))
            problems = cuda_handles.ipc_problems(sender, receivers, sender_name, receiver_name)
        if problems:
            raise ValueError(
                "the cuda_ipc transport cannot work here:\n"
                + "\n".join(f"  {problem}" for problem in problems)
            )

    def admit(self, manifest: Manifest) -> None:
        """``checksums`` switched off after construction is refused too, before anything is sent."""
        self._refuse_unhashed(manifest.hashed)

    @staticmethod
    def _refuse_unhashed(hashed: bool) -> None:
        if not hashed:
            raise ValueError("the cuda_ipc transport always checksums (checksums=False is not supported)")

    def transfer(self, manifest: Manifest) -> tuple[dict[int, int], None]:
        """Like the object store, one bucket at a time, but only CUDA IPC handles travel: the sender
        packs bucket i+1 on its GPU while the receivers copy bucket i, and frees bucket i-1 (every
        receiver acknowledged it) before packing, so at most two buckets are alive."""
        link, version = self.link, manifest.version
        checksums: dict[int, int] = {}
        shares = link.stream(CudaIpcSender.weights_ipc_share, manifest, lambda i: (version, i, i - 2))
        for index, (digest, handle) in shares:
            checksums[index] = digest
            link.on_receivers(CudaIpcReceiver.weights_receive_ipc, version, index, handle)
        return checksums, None


def _node_of(group: WorkerGroup, rank: int) -> str:
    """``node <rank> (<ray node id>)``: the Ray node id where the worker started, if known."""
    node_id, node = group.node_id_of(rank), f"node {group.node_rank_of(rank)}"
    return f"{node} ({node_id[:8]})" if node_id else node


class CudaIpcSide:
    """What both sides report, to check a pairing before any transfer."""

    @served_asleep
    def weights_cuda_info(self) -> cuda_handles.CudaInfo:
        import ray

        return cuda_handles.cuda_info(ray.get_runtime_context().get_node_id() if ray.is_initialized() else "")


class CudaIpcSender(CudaIpcSide, SenderSide):
    """The trainer's side: each bucket packed on its GPU and shared, at most two alive."""

    @served_asleep
    def weights_ipc_share(self, version: int, index: int, acked: int) -> tuple[int, cuda_handles.IpcBucket]:
        """Pack bucket ``index`` on this GPU and share it by CUDA IPC; every receiver has copied
        the buckets ``<= acked``, which are freed first (so at most two are ever alive).

        Returns the checksum of the packed bytes and the handle receivers map.
        """
        sending = self._weights_sending(version)
        spec = sending.buckets[index]
        live = cuda_handles.live_buckets()
        live.release_through(acked)
        buffer, digest, handle = cuda_handles.share_bucket(sending.state, spec, cuda_handles.host_staging())
        live.hold(index, buffer, spec.nbytes)
        return digest, handle

    def _weights_forget(self) -> None:
        super()._weights_forget()
        cuda_handles.live_buckets().release_all()


class CudaIpcReceiver(CudaIpcSide, ReceiverSide):
    """A rollout worker's side: each shared bucket mapped and copied into the GPU shadow."""

    @served_asleep
    def weights_receive_ipc(self, version: int, index: int, bucket: cuda_handles.IpcBucket) -> None:
        """Map the sender's bucket (CUDA IPC, no copy), copy it into the GPU shadow, checksum what
        landed (through a host copy), and drop the mapping so the sender may free the bucket."""
        shadow = self._weights_shadow(version)
        target = shadow.buckets[index]  # of the same manifest as the bucket: the same size
        source = cuda_handles.open_bucket(bucket, _visible_uuids())
        try:
            target.copy_(source)
            shadow.checksums[index] = cuda_handles.host_staging().checksum(target)  # waits for the copy
        finally:
            del source


@functools.cache
def _visible_uuids() -> tuple[str, ...]:
    """The devices this process sees, by local index (asked once: they do not change)."""
    return cuda_handles.cuda_info().visible_uuids
