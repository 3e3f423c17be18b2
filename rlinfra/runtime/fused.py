"""Several roles in one worker process (verl's "fused" worker), each still called by its name.

Colocated roles that must share a device *and* a process (actor + reference model sharing
weights in memory, say) are written as separate ``Worker`` classes and fused:

    Policy = fuse(actor=ActorRole, ref=ReferenceRole)
    policy = Policy.create_group(actor={"lr": 1e-4}, ref=("/models/ref",)).launch(
        cluster, placement.get_strategy("policy"), name="policy")
    policy.role("actor").train(batch).wait()       # errors name "policy/actor"

Each role instance gets the same rank, placement and environment as the hosting process, and
logs as ``policy/actor:3``.
"""

from collections.abc import Mapping
from typing import Any, cast

from rlinfra.placement.record import Placement
from rlinfra.runtime.hosting import bind_identity
from rlinfra.runtime.worker import Worker


def fuse(**roles: type[Worker]) -> type[Worker]:
    """A ``Worker`` class hosting one instance of each role class in the same process."""
    if not roles:
        raise ValueError("fuse() needs at least one role, e.g. fuse(actor=ActorRole, ref=RefRole)")
    for role, cls in roles.items():
        if not (isinstance(cls, type) and issubclass(cls, Worker)):
            raise TypeError(f"role {role!r} must be a Worker subclass, got {cls!r}")

    class FusedWorker(Worker):
        """Hosts the roles; ``create_group(role=kwargs_dict_or_args_tuple, ...)``."""

        fused_roles: Mapping[str, type[Worker]] = dict(roles)

        def __init__(self, **role_args: Any) -> None:
            unknown = set(role_args) - set(roles)
            if unknown:
                raise TypeError(
                    f"constructor arguments for unknown role(s) {sorted(unknown)}; roles: {list(roles)}"
                )
            self._role_instances: dict[str, Worker] = {}
            for role, cls in roles.items():
                args, kwargs = _split_args(role_args.get(role, ()))
                instance = cls.__new__(cls)
                placement = cast(Placement, self._placement)  # bound before any constructor runs
                bind_identity(
                    instance, f"{self._group_name}/{role}", placement, self._hardware, self._incarnation
                )
                try:
                    cls.__init__(instance, *args, **kwargs)
                except Exception as error:
                    if hasattr(error, "add_note"):  # Python >= 3.11: the traceback names the role
                        error.add_note(f"while starting role {role!r} of fused worker {self!r}")
                    raise
                self._role_instances[role] = instance

        def role_instance(self, role: str) -> Worker:
            """This process's instance of ``role``: how one role reaches another in the same
            process (a learner using the reference model's weights in memory, say)."""
            return self._role_instances[role]

        def rlinfra_role_call(self, role: str, method: str, args: tuple, kwargs: dict) -> Any:
            return getattr(self._role_instances[role], method)(*args, **kwargs)

    name = "Fused" + "".join(cls.__name__ for cls in roles.values())
    FusedWorker.__name__ = FusedWorker.__qualname__ = name
    return FusedWorker


def _split_args(value: Any) -> tuple[tuple, dict]:
    if isinstance(value, Mapping):
        return (), dict(value)
    if isinstance(value, (tuple, list)):
        return tuple(value), {}
    return (value,), {}
