"""``rlinfra.rendezvous``: torch.distributed bring-up over worker groups (see
``rlinfra.runtime.rendezvous`` for the contract). Driver side: ``bring_up``, ``tear_down``,
``bring_up_cross``, ``tear_down_cross``; worker side: ``init_process_group``,
``destroy_process_group``, ``cross_group``, ``leave_cross_group``."""

from rlinfra.runtime.rendezvous import (
    CrossGroup,
    CrossGroupInfo,
    bring_up,
    bring_up_cross,
    cross_group,
    default_backend,
    destroy_process_group,
    init_process_group,
    leave_cross_group,
    tear_down,
    tear_down_cross,
)

__all__ = [
    "CrossGroup",
    "CrossGroupInfo",
    "bring_up",
    "bring_up_cross",
    "cross_group",
    "default_backend",
    "destroy_process_group",
    "init_process_group",
    "leave_cross_group",
    "tear_down",
    "tear_down_cross",
]
