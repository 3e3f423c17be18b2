"""The ``"broadcast"`` transport: torch.distributed broadcast over a cross-component group.

The group is brought up by the driver (``rlinfra.runtime.rendezvous.bring_up_cross``) with the
sender at cross rank 0 (gloo here, nccl on GPUs); every bucket is packed on the sender and
broadcast, in bucket order, into the receivers' private shadows. A collective fails for every
member when one dies, so a failure asks the receivers who died, and says that the group must be
brought up again without them.
"""

from typing import Any

import numpy as np

from rlinfra.runtime.errors import WorkerGroupError
from rlinfra.runtime.process_groups import cross_group
from rlinfra.runtime.served_asleep import served_asleep
from rlinfra.services.weights.buckets import Manifest, checksum, pack
from rlinfra.services.weights.transports.base import ReceiverSide, SenderSide, Transport, gone_ranks

# How long a failed broadcast waits for the receivers to say which of them died.
BLAME_GRACE_S = 3.0


class BroadcastTransport(Transport):
    """The driver: one collective call on the sender and on every receiver, for all buckets."""

    def check(self, checksums: bool) -> None:
        if not self.cross_group:
            raise ValueError("the broadcast transport needs cross_group=<name> (rendezvous.bring_up_cross)")

    def transfer(self, manifest: Manifest) -> tuple[dict[int, int], None]:
        link, version = self.link, manifest.version
        send = link.sender_call(BroadcastSender.weights_broadcast, version, self.cross_group)
        receive = link.receivers_call(BroadcastReceiver.weights_receive_broadcast, version, self.cross_group)
        try:
            checksums = send.wait()[0]
        except WorkerGroupError as sender_error:
            self._blame_dead_receivers(receive, sender_error)
            raise
        link.wait(receive)
        return checksums, None

    def _blame_dead_receivers(self, receive: Any, sender_error: WorkerGroupError) -> None:
        """A collective fails for every member when one dies, and the sender usually notices
        first ("connection closed by peer"). Give the receivers a moment to say who died: if one
        did, raise that — it names the dead worker — and stop counting on it. Survivors still
        blocked in the collective are reported as still running, not waited for."""
        try:
            receive.wait(timeout=BLAME_GRACE_S)
        except WorkerGroupError as error:
            if gone_ranks(error):
                self.link.forget_dead(error)
                raise error from sender_error

    def failure_note(self, error: BaseException) -> str:
        if not gone_ranks(error):
            return ""
        return (
            f"The cross-component group {self.cross_group!r} lost a member: bring it up again "
            "without the dead workers (rendezvous.bring_up_cross) before the next broadcast update."
        )


class BroadcastSender(SenderSide):
    """The trainer's side: each bucket packed into one reused buffer and broadcast from it."""

    @served_asleep
    def weights_broadcast(self, version: int, group_name: str) -> dict[int, int]:
        """Send every bucket through a cross-component process group (this rank is its src)."""
        import torch

        sending = self._weights_sending(version)
        group = cross_group(group_name)
        digests: dict[int, int] = {}
        buffer = np.empty(max((spec.nbytes for spec in sending.buckets), default=0), dtype=np.uint8)
        for spec in sending.buckets:
            view, digests[spec.index] = pack(sending.state, spec, buffer[: spec.nbytes], sending.hashed)
            group.broadcast(torch.from_numpy(view), src=group.rank)
        return digests


class BroadcastReceiver(ReceiverSide):
    """A rollout worker's side: each bucket broadcast straight into the private shadow."""

    @served_asleep
    def weights_receive_broadcast(self, version: int, group_name: str, src: int = 0) -> None:
        """Receive every bucket from a cross-component process group, in bucket order."""
        import torch

        shadow = self._weights_shadow(version)
        group = cross_group(group_name)
        for index, buffer in enumerate(shadow.buckets):
            group.broadcast(torch.from_numpy(buffer), src=src)
            if shadow.manifest.hashed:
                shadow.checksums[index] = checksum(buffer)
