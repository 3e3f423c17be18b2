"""How a call reaches a group's ranks in RLinf's style: ``group.method(...)`` broadcasts,
``group.execute_on(0, 2).method(...)`` picks ranks, ``group.role("actor")`` picks a fused role,
``.scatter``/``.split`` dispatch per rank. Each form ends in ``WorkerGroup.call``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rlinfra.runtime.calls import GroupCall, concat_chunks, split_batch

ROLE_CALL = "rlinfra_role_call"  # what rlinfra.runtime.fused gives a fused worker to reach a role


class WorkerGroupView:
    """The ranks a call goes to (all, or a subset from ``execute_on``), and for a fused worker
    the role it goes to."""

    def __init__(self, group: Any, ranks: list[int] | None, role: str | None = None) -> None:
        self._group = group
        self._ranks = ranks
        self._role = role

    def role(self, name: str) -> WorkerGroupView:
        """The same ranks, calling role ``name`` of a fused worker (see ``rlinfra.fuse``)."""
        roles = getattr(self._group.worker_cls, "fused_roles", {})
        if name not in roles:
            raise AttributeError(
                f"worker group {self._group.name!r} has no role {name!r}"
                + (f"; its roles are {list(roles)}" if roles else " (it is not a fused worker)")
            )
        return WorkerGroupView(self._group, self._ranks, name)

    def __getattr__(self, method: str) -> GroupMethod:
        if method.startswith("_"):
            raise AttributeError(method)
        group = self._group
        if not group.actors:
            raise RuntimeError(f"worker group {group.name!r} is not launched (call .launch first)")
        cls = getattr(group.worker_cls, "fused_roles", {})[self._role] if self._role else group.worker_cls
        if not callable(getattr(cls, method, None)):
            raise AttributeError(f"{cls.__name__} has no method {method!r}")
        ranks = self._ranks if self._ranks is not None else group.ranks
        return GroupMethod(group, method, ranks, self._role)


class GroupMethod:
    """``group.method(...)`` broadcasts; ``.scatter(per_rank)`` and ``.split(batch)`` dispatch
    per rank. Every form returns a ``GroupCall``; errors name the role of a fused worker."""

    def __init__(self, group: Any, method: str, ranks: list[int], role: str | None = None) -> None:
        self.group = group  # the ``WorkerGroup`` the call goes to
        self._method = method
        self._ranks = ranks
        self._role = role

    def __repr__(self) -> str:
        return f"{self.group.name}{'/' + self._role if self._role else ''}.{self._method}"

    def __call__(self, *args: Any, **kwargs: Any) -> GroupCall:
        return self._fan_out([args] * len(self._ranks), kwargs)

    def scatter(self, per_rank: Sequence[Any], *args: Any, **kwargs: Any) -> GroupCall:
        """Rank ``self._ranks[i]`` gets ``per_rank[i]`` as its first argument."""
        return self._fan_out([(value, *args) for value in per_rank], kwargs)

    def split(self, batch: Any, *args: Any, **kwargs: Any) -> GroupCall:
        """Cut ``batch`` into one contiguous chunk per rank; ``wait`` concatenates the results in
        rank order (each rank must return a sequence)."""
        chunks = split_batch(batch, len(self._ranks))
        return self._fan_out([(chunk, *args) for chunk in chunks], kwargs, gather=concat_chunks)

    def _fan_out(self, per_rank_args: list[tuple], kwargs: dict[str, Any], gather: Any = None) -> GroupCall:
        group, role, method = self.group, self._role, self._method
        if role is None:
            return group.call(method, self._ranks, per_rank_args, kwargs=kwargs, gather=gather)
        role_args = [(role, method, args, kwargs) for args in per_rank_args]
        label = f"{group.name}/{role}"
        return group.call(ROLE_CALL, self._ranks, role_args, action=method, gather=gather, label=label)
