"""``WorkerGroup``: launch a ``Worker`` class on its placements, call it, and shut it down.

``Rollout.create_group(args).launch(cluster, placement_strategy=s, name="rollout")`` turns each
``Placement`` into one Ray actor named ``rollout:<rank>``, in its slice of a ``Layout`` (the job's,
or a one-component layout the group reserves and releases itself): a placement group whose
bundles are pinned to the exact nodes (``ray.io/node-id`` label selectors) and ordered by (node
rank, device). Any public method called on the group fans out to all ranks and returns a
``GroupCall``; ``.scatter`` and ``.split`` are the explicit per-rank dispatch choices, and
``call`` is the one door other layers use (``group.call(HostMethods.rlinfra_ready)``). Every
call, whatever its form, passes the group's ``call_guard`` (if one is installed) before anything
is sent: ``rlinfra.runtime.timesharing`` refuses calls into a component that is asleep there.

Each worker's environment is composed by ``rlinfra.runtime.env`` (one precedence for class
defaults, the driver's allow-list, node group, component and rlinfra's values) and set inside the
process; ``cluster.secrets`` reach workers by object reference (``rlinfra.runtime.secrets``);
topology constraints are checked against the nodes before reserving
(``rlinfra.runtime.topology``), and where Ray put each bundle is checked after.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

import ray
from ray.exceptions import ActorDiedError, RayError
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from rlinfra.placement.errors import short_ranks
from rlinfra.placement.record import Placement
from rlinfra.placement.strategies import NodePlacementStrategy, PackedPlacementStrategy, PlacementStrategy
from rlinfra.runtime import process_groups
from rlinfra.runtime.bundles import ActorReservation
from rlinfra.runtime.calls import GroupCall
from rlinfra.runtime.cluster import Cluster
from rlinfra.runtime.deadline import Deadline, poll
from rlinfra.runtime.env import WorkerEnvs
from rlinfra.runtime.errors import ClusterError
from rlinfra.runtime.executable import worker_runtime_envs
from rlinfra.runtime.group_views import GroupMethod, WorkerGroupView
from rlinfra.runtime.hosting import HostMethods, WorkerContext, hosted_class
from rlinfra.runtime.layout import Layout, cpus_per_process
from rlinfra.runtime.progress import WATCH_GROUP
from rlinfra.runtime.secrets import SecretsChannel, publish_secrets
from rlinfra.runtime.stacks import python_stack
from rlinfra.runtime.supervision import (
    FAILED,
    REFUSED,
    REPLACED,
    Restart,
    RestartBudget,
    SupervisionError,
    UnreplaceableError,
)
from rlinfra.runtime.topology import BundleNode
from rlinfra.runtime.watchdog import PROBE_TIMEOUT_S

logger = logging.getLogger("rlinfra")

DEFAULT_LAUNCH_TIMEOUT_S = 120.0
DEFAULT_STUCK_AFTER_S = 300.0  # a call's rank silent this long (no return, no heartbeat) is stuck
DEFAULT_CALL_TIMEOUT_S = 600.0
GONE_PROBE_S = 5.0  # how long gone_ranks waits for the live ranks' probes
NAME_RELEASE_POLL_S = 0.02  # Ray gives no event for a killed actor's name becoming free

# Sees every call before it is sent: (the method's name as sent to the actor, the ranks); raises
# to refuse it. Calls to a fused worker's roles arrive under ROLE_CALL.
CallGuard = Callable[[str, Sequence[int]], None]


class WorkerGroup:
    """All ranks of one component. Created by ``Worker.create_group``; usable once launched."""

    def __init__(self, worker_cls: type, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.worker_cls = worker_cls
        self._args = args
        self._kwargs = kwargs
        self.name = worker_cls.__name__.lower()
        self.placements: list[Placement] = []
        self.actors: list[Any] = []
        self.worker_info: list[dict[str, Any]] = []
        self.call_timeout = DEFAULT_CALL_TIMEOUT_S
        self.stuck_after: float | None = DEFAULT_STUCK_AFTER_S
        self.master_address: tuple[str, int] | None = None
        self._layout: Layout | None = None
        self._own_layout: Layout | None = None  # reserved by launch when not given one
        self._secrets: SecretsChannel | None = None
        self._spawn_specs: list[tuple[WorkerContext, dict[str, Any]]] = []  # per rank, for replace
        self.launch_timeout = DEFAULT_LAUNCH_TIMEOUT_S
        self.restart_budget = RestartBudget(None)
        self.restarts: list[Restart] = []  # every replacement attempt, in order
        self._removed: set[int] = set()  # ranks stopped by remove(), their bundles kept for add()
        self.call_guard: CallGuard | None = None  # installed by a facility that may refuse calls

    # ----------------------------------------------------------------------------------- launch
    def launch(
        self,
        cluster: Cluster,
        placement_strategy: PlacementStrategy | None = None,
        name: str | None = None,
        *,
        num_cpus: float | None = None,
        isolate_accelerator: bool = True,
        layout: Layout | None = None,
        launch_timeout: float = DEFAULT_LAUNCH_TIMEOUT_S,
        call_timeout: float = DEFAULT_CALL_TIMEOUT_S,
        stuck_after: float | None = DEFAULT_STUCK_AFTER_S,
        max_concurrency: int = 1,
    ) -> WorkerGroup:
        """Start every rank and return when all are ready; on any failure release everything
        and raise ``WorkerGroupError`` naming the ranks, their nodes and the tracebacks.

        With ``layout``, the workers go into the layout's placement group (shared with the other
        components of the job); without, the group reserves a one-component layout of its own
        and releases it at ``shutdown``.
        ``ReservationError`` says what is missing where if resources cannot be reserved in time;
        ``TopologyError`` (at once) names a constraint no node can meet; ``PlacementError`` (a
        credential-like environment value) and ``SecretError`` (an unreadable secret) come before
        anything is reserved. Environment, secrets and constraints come from ``cluster.config``
        and from the strategy (``ComponentPlacement`` puts the component's ``env_vars`` and
        ``constraints`` on it). ``max_concurrency > 1`` runs each worker's methods in that many
        threads, e.g. so that a rollout worker keeps generating while new weights are staged into it.
        ``stuck_after`` is the default of every call's progress watch: a rank that neither returns
        nor calls ``self.heartbeat()`` for that long is reported stuck, with its stack (None: off;
        ``wait(stuck_after=...)`` overrides it per call).

        Without ``placement_strategy`` the group takes RLinf's default: one process per accelerator
        of the cluster, or one process on node 0 when there are none. ``num_cpus`` (CPUs per
        process) defaults to the component's ``num_cpus`` in the YAML, else to the rule of
        ``rlinfra.runtime.bundles.plan_layout``; a value that contradicts the config or the
        layout is refused.
        """
        if self.actors:
            raise RuntimeError(f"worker group {self.name!r} is already launched")
        placement_strategy = placement_strategy or default_strategy(cluster)
        self.name = name or self.name
        self.call_timeout, self.stuck_after, self.launch_timeout = call_timeout, stuck_after, launch_timeout
        self.restart_budget = RestartBudget(placement_strategy.restart)
        self.placements = placement_strategy.get_placement(cluster, isolate_accelerator)
        cpus = cpus_per_process(self.name, num_cpus, placement_strategy.num_cpus)
        deadline = Deadline.after(launch_timeout)
        # Configuration mistakes (credential-like env values, unreadable secrets) fail here,
        # before anything is reserved or started.
        component_envs = WorkerEnvs(
            cluster.spec,
            worker_cls=self.worker_cls,
            component_env=placement_strategy.env_vars,
            component=self.name,
            env_allowlist=cluster.config.env_allowlist,
        )
        envs = [component_envs.of(placement) for placement in self.placements]
        try:
            self._secrets = publish_secrets(cluster.config.secrets)
            # python_interpreter_path: each interpreter checked on its node before
            # anything is reserved (a bad interpreter would otherwise be retried by Ray forever).
            runtime_envs = worker_runtime_envs(cluster, self.name, self.placements)
            if layout is None:
                layout = self._own_layout = Layout(
                    cluster,
                    {self.name: placement_strategy},
                    num_cpus=cpus,
                    isolate_accelerator=isolate_accelerator,
                    timeout=launch_timeout,
                    what=f"worker group {self.name!r}",
                )
            pg, reservations = layout.slot(self.name, self.placements, cpus)
            self._layout = layout
            self._check_bundle_nodes()
            for placement, reservation, env, runtime_env in zip(
                self.placements, reservations, envs, runtime_envs, strict=True
            ):
                context = WorkerContext(
                    self.name,
                    placement,
                    dict(env.values),
                    merge_env=env.merge_with_inherited,
                    secrets=self._secrets,
                    hardware=cluster.spec.hardware_units(placement),
                )
                options = {
                    "name": f"{self.name}:{placement.rank}",
                    "num_cpus": reservation.num_cpus,
                    "num_gpus": reservation.num_gpus,
                    "resources": dict(reservation.resources),
                    "scheduling_strategy": PlacementGroupSchedulingStrategy(
                        pg, placement_group_bundle_index=reservation.bundle_index
                    ),
                    "max_concurrency": max_concurrency,
                    "runtime_env": runtime_env,
                }
                self._spawn_specs.append((context, options))
            self.actors, self.worker_info = [None] * self.world_size, [{}] * self.world_size
            self._start(self.ranks, deadline, "starting (constructor)")
            self._check_ray_device_ids()
        except BaseException:
            self.shutdown()
            raise
        return self

    @property
    def reservations(self) -> list[ActorReservation]:
        """What each rank asked Ray for (bundle, CPUs, GPUs, other resources), in rank order."""
        return list(self._launched_layout().plan.reservations[self.name])

    def bundle_report(self) -> list[BundleNode]:
        """Rank → bundle → node: as planned, and as Ray reports it (``placement_group_table``)."""
        return self._launched_layout().bundle_report(self.name)

    def _launched_layout(self) -> Layout:
        if self._layout is None:
            raise RuntimeError(f"worker group {self.name!r} is not launched (call .launch first)")
        return self._layout

    def _check_bundle_nodes(self) -> None:
        """Label selectors pin every bundle to its node, so a bundle elsewhere would be a Ray bug
        or a node-id mix-up; either would silently break rank → device stability."""
        wrong = [row for row in self.bundle_report() if not row.matches]
        if wrong:
            row = wrong[0]
            raise ClusterError(
                f"worker group {self.name!r}: Ray placed bundle {row.bundle_index} (rank {row.rank}) on "
                f"node {row.node_rank if row.node_rank is not None else row.node_id or '?'}, planned on "
                f"node {row.planned_node_rank} ({len(wrong)} rank(s) misplaced)"
            )

    def _check_ray_device_ids(self) -> None:
        """Warn when Ray's ledger holds other device ids than the ones the workers use.

        Counts are always right (the bundles reserve them); ids drift only when groups sharing
        a node are launched out of device order, and then other Ray users of that node could be
        handed a device we use. Launching a job's components in device order avoids it.
        """
        drifted = []
        for placement, info in zip(self.placements, self.worker_info, strict=True):
            ray_ids = [int(i) for i in info["ray_accelerator_ids"].get(placement.hardware_type, [])]
            if placement.visible_devices is not None and ray_ids != list(placement.local_hardware_ranks):
                drifted.append(f"rank {placement.rank} uses {placement.visible_devices}, Ray: {ray_ids}")
        if drifted:
            logger.warning(
                f"worker group {self.name!r}: Ray's device ids (not counts) differ from the placement on "
                f"{len(drifted)} rank(s): {'; '.join(drifted[:4])}"
            )

    def refresh_master_address(self, timeout: float) -> None:
        """Rank 0 holds a bound port (a fresh one if a process group consumed the last), and every
        rank learns ``MASTER_ADDR``/``MASTER_PORT``; within ``timeout`` seconds. ``launch`` does it
        once; ``rlinfra.runtime.rendezvous`` again before and after each process group."""
        deadline = Deadline.after(timeout)
        reserve, action = (process_groups.reserve_master_port,), "reserving the rendezvous port"
        reserving = self.call(HostMethods.rlinfra_run, [0], args=reserve, action=action)
        self._publish_master(reserving.wait(timeout)[0], self.ranks, deadline.left())

    def _publish_master(self, master: tuple[str, int], ranks: list[int], timeout: float) -> None:
        """Tell ``ranks`` the rendezvous address rank 0 holds (``MASTER_ADDR``/``MASTER_PORT``)."""
        publish = (process_groups.set_master, *master)
        self.call(HostMethods.rlinfra_run, ranks, args=publish, action="publishing MASTER_ADDR").wait(timeout)
        self.master_address = master

    # ------------------------------------------------------------------------------- dispatch
    @property
    def world_size(self) -> int:
        return len(self.placements)

    @property
    def ranks(self) -> list[int]:
        """The ranks running now, in order: every launched rank but those ``remove``d."""
        return [rank for rank in range(len(self.actors)) if rank not in self._removed]

    def role(self, name: str) -> WorkerGroupView:
        """All ranks, calling role ``name`` of a fused worker: ``group.role("ref").score(x)``."""
        return WorkerGroupView(self, None).role(name)

    def execute_on(self, *ranks: int) -> WorkerGroupView:
        """A view of some ranks, given as separate arguments as in RLinf:
        ``group.execute_on(0, 2).method(x).wait()``. Unlike RLinf's, the group itself is not
        changed: the view is what calls those ranks, so a later ``group.method()`` still reaches
        every rank."""
        chosen = list(ranks)
        if not chosen or any(isinstance(rank, bool) or not isinstance(rank, int) for rank in chosen):
            raise TypeError(
                f"{self.name}.execute_on takes ranks as separate ints, e.g. (0, 2); got {ranks!r}"
            )
        self._refuse_unless(chosen, self.ranks, "execute on")
        return WorkerGroupView(self, chosen)

    def _refuse_unless(self, ranks: Sequence[int], allowed: Collection[int], doing: str) -> None:
        """``ValueError`` naming the ``ranks`` not in ``allowed``, with the ranks running and removed."""
        bad = sorted(set(ranks) - set(allowed))
        if bad:
            removed = f"; removed: {sorted(self._removed)}" if self._removed else ""
            raise ValueError(
                f"worker group {self.name!r} has ranks {short_ranks(self.ranks)} running{removed}; "
                f"cannot {doing} {', '.join(map(str, bad))}"
            )

    def __getattr__(self, method: str) -> GroupMethod:
        return WorkerGroupView(self, None).__getattr__(method)  # refuses private names

    def node_rank_of(self, rank: int) -> int | None:
        return self.placements[rank].cluster_node_rank if 0 <= rank < len(self.placements) else None

    def node_id_of(self, rank: int) -> str:
        """The Ray node id the worker of ``rank`` started on, as it reported when it came up."""
        if not 0 <= rank < len(self.worker_info):
            raise ValueError(f"worker group {self.name!r} has no started rank {rank}")
        return self.worker_info[rank]["node_id"]

    @property
    def cluster(self) -> Cluster:
        """The cluster the group was launched on (its layout's)."""
        return self._launched_layout().cluster

    def call(
        self,
        method: str | Callable[..., Any],
        ranks: Sequence[int] | None = None,
        per_rank: Sequence[tuple[Any, ...]] | None = None,
        *,
        args: tuple[Any, ...] = (),
        kwargs: Mapping[str, Any] | None = None,
        timeout: float | None = None,
        action: str | None = None,
        gather: Callable[[list[Any]], Any] | None = None,
        label: str | None = None,
    ) -> GroupCall:
        """Call ``method`` on ``ranks`` (every rank by default) and return the pending ``GroupCall``.

        ``method`` is a method's name or the method itself (``WeightReceiver.weights_swap``), so
        that a reader can follow the call into the worker. Rank ``ranks[i]`` gets
        ``*per_rank[i]`` when ``per_rank`` is given, else ``*args``; every rank gets ``kwargs``.
        ``timeout`` is the default deadline of ``wait`` (the group's ``call_timeout`` otherwise);
        ``action`` names the call in errors (the method's name otherwise); ``gather`` combines the
        results (a split call); ``label`` names the group in errors (a fused role). This is the one
        door every call goes through (``group.method(...)``, views, roles, other layers), past the
        ``call_guard``.
        """
        name = method if isinstance(method, str) else method.__name__
        chosen = self.ranks if ranks is None else list(ranks)
        if per_rank is not None and len(per_rank) != len(chosen):
            raise ValueError(
                f"{self.name}.{action or name}: {len(per_rank)} per-rank arguments for {len(chosen)} ranks"
            )
        if self.call_guard is not None:
            self.call_guard(name, chosen)
        calls = zip(chosen, per_rank if per_rank is not None else [args] * len(chosen), strict=True)
        # The task's name is its process's title while it runs: ps shows ray::rollout:1.collect
        named = [(getattr(self.actors[r], name), f"{self.name}:{r}.{name}", call) for r, call in calls]
        refs = [method.options(name=title).remote(*call, **(kwargs or {})) for method, title, call in named]
        timeout = self.call_timeout if timeout is None else timeout
        return GroupCall(self, action or name, refs, chosen, timeout, gather, label)

    def probe_heartbeats(self, ranks: Sequence[int], timeout_s: float) -> dict[int, Any]:
        """Each rank's answer to a heartbeat probe within ``timeout_s``: seconds since its last
        ``heartbeat()`` (None: never), or the ``RayError`` the probe raised (a dead rank's fails at
        once); ranks that do not answer are left out. Probes are answered in the ranks' watch
        threads, so busy or stuck ranks answer."""
        refs = {self.actors[rank].rlinfra_heartbeat_age.remote(): rank for rank in ranks}
        ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=timeout_s)
        answers: dict[int, Any] = {}
        for ref in ready:
            try:
                answers[refs[ref]] = ray.get(ref, timeout=0)
            except RayError as error:
                answers[refs[ref]] = error
        return answers

    def stack_of(self, rank: int) -> str:
        """The rank's Python stack now: py-spy's view from outside (it works while the worker holds
        the GIL), else the worker's own view of its threads, else why there is none."""
        info = self.worker_info[rank]
        stack = python_stack(info["node_id"], info["pid"])
        if stack is not None:
            return stack
        ref = self.actors[rank].rlinfra_thread_stacks.remote()
        with contextlib.suppress(RayError):  # no answer in time (GetTimeoutError), or the worker is gone
            threads = ray.get(ref, timeout=PROBE_TIMEOUT_S)
            return f"(from inside the worker; py-spy could not attach)\n{threads}"
        return "(no stack: py-spy could not attach, and the worker holds its interpreter)"

    # ---------------------------------------------------------------------------- supervision
    def gone_ranks(self, timeout_s: float = GONE_PROBE_S) -> list[int]:
        """Ranks whose process or node is gone now. Every rank is probed in its watch thread, so a
        busy or stuck rank still answers; a dead one's probe fails at once."""
        dead_nodes = self.cluster.dead_node_ranks()
        gone = {rank for rank in self.ranks if self.node_rank_of(rank) in dead_nodes}
        answers = self.probe_heartbeats([rank for rank in self.ranks if rank not in gone], timeout_s)
        # A rank unavailable for now (not known dead) is not gone: it is not replaced.
        gone.update(rank for rank, answer in answers.items() if isinstance(answer, ActorDiedError))
        return sorted(gone)

    def replace(self, rank: int, reason: str = "", *, timeout: float | None = None) -> Restart:
        """Relaunch ``rank`` into its own reserved bundle: same rank, node, devices, environment
        and constructor arguments, a fresh process. The old worker is killed first if it still
        runs. Returns once the new one is ready (its ``MASTER_ADDR``/``MASTER_PORT`` set); its
        state is the constructor's — weights come from ``WeightSync.admit``.

        Charged to the group's restart budget (``restart:`` in the YAML); raises
        ``RestartBudgetExhausted`` when it is spent, ``UnreplaceableError`` when the rank's node is
        gone, and ``WorkerGroupError`` when the new worker does not come up within ``timeout``
        (default: the launch timeout). Every attempt is recorded in ``restarts``.
        """
        self._launched_layout()
        self._refuse_unless([rank], self.ranks, "replace")
        node_rank, started, wall = self.node_rank_of(rank), time.monotonic(), time.time()

        def record(outcome: str, detail: str = "") -> Restart:
            took = time.monotonic() - started
            self.restarts.append(Restart(self.name, rank, node_rank, reason, wall, took, outcome, detail))
            return self.restarts[-1]

        try:
            if node_rank in self.cluster.dead_node_ranks():
                lost = "its node is gone, so its bundle and devices cannot be had again"
                raise UnreplaceableError(self.name, rank, node_rank, lost)
            self.restart_budget.charge(self.name, rank, node_rank)
        except SupervisionError as error:
            record(REFUSED, str(error))
            raise
        deadline = Deadline.after(self.launch_timeout if timeout is None else timeout)
        try:
            self._retire(rank, deadline)
            self._start_again([rank], deadline, "restarting (constructor)")
        except BaseException as error:
            record(FAILED, str(error).splitlines()[0] if str(error) else type(error).__name__)
            raise
        return record(REPLACED)

    # ------------------------------------------------------------------------------- elastic
    def remove(self, ranks: Sequence[int], *, timeout: float | None = None) -> None:
        """Stop ``ranks`` for now (elastic scale-down): their processes are killed, their bundles
        stay reserved, and calls no longer reach them (``ranks`` leaves them out) until ``add``
        starts them again. At least one rank must keep running."""
        chosen = sorted(set(ranks))
        self._refuse_unless(chosen, self.ranks, "remove")
        if len(chosen) == len(self.ranks):
            raise ValueError(f"worker group {self.name!r}: cannot remove every rank; shut the group down")
        deadline = Deadline.after(self.launch_timeout if timeout is None else timeout)
        for rank in chosen:
            self._retire(rank, deadline)
            self._removed.add(rank)

    def add(self, ranks: Sequence[int], *, timeout: float | None = None) -> None:
        """Start removed ``ranks`` again in their own bundles (elastic scale-up within the reserved
        layout): the same mechanism as ``replace``, not charged to the restart budget. Their state
        is the constructor's (weights come from ``WeightSync.admit``)."""
        chosen = sorted(set(ranks))
        self._refuse_unless(chosen, self._removed, "add")
        deadline = Deadline.after(self.launch_timeout if timeout is None else timeout)
        self._removed.difference_update(chosen)  # running again: the address reaches them too
        try:
            self._start_again(chosen, deadline, "adding (constructor)")
        except BaseException:
            for rank in chosen:  # not running: kill whatever started, keep them removed
                with contextlib.suppress(Exception):
                    ray.kill(self.actors[rank], no_restart=True)
            self._removed.update(chosen)
            raise

    def _start_again(self, ranks: list[int], deadline: Deadline, action: str) -> None:
        """New processes for ``ranks``, their next incarnation: what ``replace`` and ``add`` both
        do once the old is gone."""
        for rank in ranks:
            context, options = self._spawn_specs[rank]
            later = dataclasses.replace(context, incarnation=context.incarnation + 1)
            self._spawn_specs[rank] = (later, options)
        self._start(ranks, deadline, action)

    def _start(self, ranks: list[int], deadline: Deadline, action: str) -> None:
        """Start ``ranks`` from their spawn specs (same name, bundle, resources and context as
        recorded at launch), ready and told the rendezvous address."""
        actor_cls = actor_class(self.worker_cls)
        for rank in ranks:
            context, options = self._spawn_specs[rank]
            self.actors[rank] = actor_cls.options(**options).remote(context, *self._args, **self._kwargs)
        ready = self.call(HostMethods.rlinfra_ready, ranks, action=action)
        # No progress watch: nothing answers a probe before its constructor has returned.
        for rank, info in zip(ranks, ready.wait(timeout=deadline.left(), stuck_after=None), strict=True):
            self.worker_info[rank] = info  # node, pid and devices, as the rank reports them
        # A new rank 0 binds the rendezvous port again for everyone; other new ranks learn the address.
        if 0 in ranks or self.master_address is None:
            self.refresh_master_address(deadline.left())
        else:
            self._publish_master(self.master_address, ranks, deadline.left())

    def _retire(self, rank: int, deadline: Deadline) -> None:
        """Kill the rank's actor and wait until Ray has let go of it (its name is free again)."""
        old, name = self.actors[rank], f"{self.name}:{rank}"
        with contextlib.suppress(Exception):
            ray.kill(old, no_restart=True)
        death = old.rlinfra_heartbeat_age.remote()  # fails once the actor is dead: the event to wait on
        ray.wait([death], timeout=deadline.left())

        def released() -> bool | None:  # the name is freed as the actor's death is recorded, a moment after
            try:
                ray.get_actor(name)
            except ValueError:
                return True
            return None

        message = f"worker group {self.name!r}: Ray still holds actor {name!r} after it was killed"
        poll(released, deadline, lambda: ClusterError(message), every_s=NAME_RELEASE_POLL_S)

    # ------------------------------------------------------------------------------- teardown
    def shutdown(self) -> None:
        """Kill every worker and release the group's own layout (a shared one stays with its
        owner). Safe to call twice."""
        for actor in self.actors:
            with contextlib.suppress(Exception):  # already dead is fine
                ray.kill(actor, no_restart=True)
        self.actors = []
        if self._own_layout is not None:
            self._own_layout.release()
            self._own_layout = None
        self._secrets = None  # drops the driver's reference: the secrets object is freed

    def __repr__(self) -> str:
        return f"WorkerGroup({self.name!r}, world_size={self.world_size}, launched={bool(self.actors)})"


@functools.cache
def actor_class(worker_cls: type) -> Any:
    """The Ray actor class hosting ``worker_cls``, made once per class: Ray pickles and exports a
    new actor class on its first use, which every launch of a fresh one paid again (a restarted
    trainer, a relaunched group). Its watch group is a thread of the actor's own that answers
    progress probes while the worker's method is busy (``rlinfra.runtime.progress``)."""
    watched: Any = ray.remote(concurrency_groups={WATCH_GROUP: 1})  # type: ignore[call-overload]
    return watched(hosted_class(worker_cls))


def default_strategy(cluster: Cluster) -> PlacementStrategy:
    """RLinf's default placement: one process per accelerator of the cluster, else one on node 0."""
    if cluster.num_accelerators > 0:
        return PackedPlacementStrategy(0, cluster.num_accelerators - 1)
    return NodePlacementStrategy([0])
