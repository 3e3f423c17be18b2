"""The main job: PPO on CartPole, its three components placed by a YAML config and launched on Ray.

One iteration, with ``algo.max_staleness: 1`` (the default):

    wait for rollout k            made entirely with weight version v (checked, stamped)
    commit v+1 if staged          pause → swap → verify → resume, between rollouts: nothing in flight
    start rollout k+1             on the newest weights; runs while the actor trains on rollout k
    train on rollout k            2 data-parallel ranks; version v+1 → v+2
    prepare v+2                   staged into the rollout workers while rollout k+1 goes on

So generation overlaps training and weight staging, each batch has exactly one version, and a
batch is at most one update old when trained on (older ones would be dropped by ``filter_stale``).
With ``max_staleness: 0`` the loop is strictly on-policy: collect, train, update, repeat.

Entry points: ``rlinfra run examples/ppo_cartpole/disaggregated.yaml`` and
``python -m examples.ppo_cartpole --config-name disaggregated algo.iterations=50``.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import math
import signal
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gymnasium as gym
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.text import Text

from examples.ppo_cartpole import reporting
from examples.ppo_cartpole.ppo.config import PPOConfig
from examples.ppo_cartpole.workers import ActorWorker, EnvWorker, RolloutWorker
from rlinfra import Cluster, ComponentPlacement
from rlinfra.placement import PlacementError
from rlinfra.placement.config_access import to_plain
from rlinfra.rendezvous import bring_up
from rlinfra.runtime.bundles import LayoutPlan
from rlinfra.runtime.errors import ClusterError, WorkerGroupError
from rlinfra.runtime.layout import Layout
from rlinfra.services.weights import Stamped, WeightSync, WeightSyncError, filter_stale
from rlinfra.services.weights.barrier import TRANSPORTS, Prepared

COMPONENTS = ("actor", "rollout", "env")


class JobConfigError(ValueError):
    """A mistake in the job's own config sections (``algo``, ``run``), named by key."""


@dataclass(frozen=True)
class RunSettings:
    """The ``run`` section: where outputs go and how patient the job is."""

    output_dir: str = "outputs/ppo_cartpole"
    checkpoint_every: int = 1  # iterations; a checkpoint is ~100 kB, so every iteration is cheap
    transport: str = "object_store"  # weight-sync transport
    request_timeout_s: float = 60.0  # an env worker's wait for one batch of actions
    call_timeout_s: float = 300.0  # the driver's wait for a rollout or a training step
    launch_timeout_s: float = 180.0
    plot: bool = True


@dataclass
class JobResult:
    """What a run did; the CLI prints it and the tests check it."""

    solved: bool
    interrupted: bool
    iterations: int  # counted across resumes
    env_steps: int
    training_s: float  # from the first rollout to the last update, across resumes
    wall_s: float  # this process: Ray start, launch, training and teardown
    time_to_target_s: float | None
    mean_return: float
    first_mean_return: float
    output_dir: Path
    plot: Path | None
    placements: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    misplaced_bundles: list[str] = field(default_factory=list)
    batch_versions: list[list[int]] = field(default_factory=list)  # per iteration, per env worker
    served_versions: list[int] = field(default_factory=list)  # rollout workers' version after each sync
    dropped_batches: int = 0
    resumed_from: int = 0

    @property
    def steps_per_s(self) -> float:
        return self.env_steps / self.training_s if self.training_s > 0 else 0.0


USAGE_ERROR, FAILED, INTERRUPTED = 2, 1, 130


def main(cfg: Mapping[str, Any], *, resume: bool = False) -> int:
    """``rlinfra run`` / ``python -m examples.ppo_cartpole``: run, then say what happened and
    where the outputs are. Returns the process exit status."""
    console = Console()
    errors = Console(stderr=True)
    try:
        result = run(cfg, resume=resume, console=console)
    except (JobConfigError, PlacementError, ClusterError, FileNotFoundError) as error:
        errors.print(Text.assemble(("error: ", "bold red"), str(error)), highlight=False)
        return USAGE_ERROR
    except (WorkerGroupError, WeightSyncError) as error:
        errors.print(Text.assemble(("the job failed: ", "bold red"), str(error)), highlight=False)
        return FAILED
    console.print(summary(result, algo_config(cfg)), highlight=False, soft_wrap=True)
    return INTERRUPTED if result.interrupted else 0


def summary(result: JobResult, algo: PPOConfig) -> str:
    """The closing lines: outcome, time-to-target, throughput and where the files are."""
    target = f"{algo.target_return:g}"
    if result.interrupted:
        head = (
            f"interrupted after iteration {result.iterations}; workers and placement groups released; "
            f"continue with --resume (checkpoint in {result.output_dir})"
        )
    elif result.solved:
        head = f"reached mean return {target} (last {algo.return_window} episodes: {result.mean_return:.1f})"
    else:
        head = (
            f"did NOT reach mean return {target} in {result.iterations} iterations ({result.mean_return:.1f})"
        )
    ttt = f"{result.time_to_target_s:.1f} s" if result.time_to_target_s is not None else "—"
    lines = [
        head,
        f"time-to-{target}: {ttt} training ({result.wall_s:.1f} s wall, including Ray start and launch) | "
        f"{result.iterations} iterations | {result.env_steps} env steps | {result.steps_per_s:.0f} steps/s",
        f"metrics: {result.output_dir / reporting.METRICS_FILE}",
    ]
    if result.plot is not None:
        lines.append(f"learning curve: {result.plot}")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------- config
def algo_config(cfg: Mapping[str, Any]) -> PPOConfig:
    """``algo`` as a ``PPOConfig``; an unknown key is named with the keys that exist."""
    algo = _dataclass_section(PPOConfig, cfg, "algo")
    _require(algo.iterations >= 1, "algo.iterations", algo.iterations, "at least 1")
    _require(algo.max_staleness >= 0, "algo.max_staleness", algo.max_staleness, "0 or more")
    _require(algo.num_envs >= 1 and algo.num_steps >= 1, "algo.num_envs/num_steps", algo.num_envs, ">= 1")
    options = ("ddp", "allreduce")
    _require(algo.data_parallel in options, "algo.data_parallel", algo.data_parallel, f"one of {options}")
    return algo


def run_settings(cfg: Mapping[str, Any]) -> RunSettings:
    settings = _dataclass_section(RunSettings, cfg, "run")
    _require(settings.checkpoint_every >= 1, "run.checkpoint_every", settings.checkpoint_every, "at least 1")
    _require(settings.transport in TRANSPORTS, "run.transport", settings.transport, f"one of {TRANSPORTS}")
    for key in ("request_timeout_s", "call_timeout_s", "launch_timeout_s"):
        _require(getattr(settings, key) > 0, f"run.{key}", getattr(settings, key), "a positive number")
    return settings


def _require(ok: bool, key: str, value: Any, expected: str) -> None:
    if not ok:
        raise JobConfigError(f"{key}: got {value!r}; expected {expected}")


def _dataclass_section(kind: type, cfg: Mapping[str, Any], name: str) -> Any:
    section = to_plain(cfg.get(name)) or {}
    if not isinstance(section, Mapping):
        raise JobConfigError(f"{name}: expected a mapping, got {section!r}")
    fields = {f.name: f for f in dataclasses.fields(kind)}
    unknown = sorted(set(section) - set(fields) - {"entrypoint"})
    if unknown:
        raise JobConfigError(f"{name}.{unknown[0]}: unknown key; expected one of {', '.join(fields)}")
    values = {key: value for key, value in section.items() if key in fields}
    defaults = kind()
    for key, value in values.items():
        want = type(getattr(defaults, key))
        ok = isinstance(value, want) or (want is float and isinstance(value, int))
        if not ok or (want is not bool and isinstance(value, bool)):
            raise JobConfigError(f"{name}.{key}: expected {want.__name__}, got {value!r}")
    return kind(**values)


# ---------------------------------------------------------------------------------------------- job
@dataclass
class _Components:
    """What a run holds on the cluster: the reserved layout and the groups launched into it."""

    layout: Layout
    actor: Any = None
    rollout: Any = None
    env: Any = None
    version: int = 0  # the trainer's weight version after setup (non-zero after a resume)

    def shutdown(self) -> None:
        for group in (self.env, self.rollout, self.actor):
            if group is not None:
                group.shutdown()
        self.layout.release()


def run(
    cfg: Mapping[str, Any],
    *,
    resume: bool = False,
    cluster: Cluster | None = None,
    console: Console | None = None,
    on_iteration: Callable[[dict[str, Any]], None] | None = None,
) -> JobResult:
    """Place, launch and train; always release what was started. ``cluster``: an existing cluster
    to use (and leave running); ``on_iteration`` sees each metrics record as it is written.
    Ctrl-C ends the run after cleanup with ``interrupted=True``; ``resume`` continues from the last
    checkpoint in ``run.output_dir``."""
    started = time.perf_counter()
    console = console or Console()
    algo, settings = algo_config(cfg), run_settings(cfg)
    spaces = env_spaces(algo.env_id)  # a wrong env id fails here, before Ray starts
    output = Path(settings.output_dir)
    checkpoint = reporting.load_checkpoint(output) if resume else None
    own_cluster = cluster is None
    live: _Components | None = None
    state = _DriverState.restore(checkpoint["driver"] if checkpoint else None, algo.return_window)
    log = reporting.MetricsLog(output, resume=resume)
    result = JobResult(
        solved=False, interrupted=False, iterations=state.iteration, env_steps=state.env_steps,
        training_s=state.training_s, wall_s=0.0, time_to_target_s=state.time_to_target_s,
        mean_return=math.nan, first_mean_return=math.nan, output_dir=output, plot=None,
        resumed_from=state.iteration,
    )  # fmt: skip
    try:
        cluster = cluster or Cluster(cfg["cluster"])
        placement = ComponentPlacement(cfg, cluster)
        envs_per_worker = _envs_per_worker(placement, algo)
        with console.status("reserving the layout"):
            live = _Components(Layout(cluster, placement, COMPONENTS))
        _show_plan(console, cluster, placement, live.layout.plan)  # what was reserved, before any worker
        _launch(live, cluster, placement, algo, spaces, envs_per_worker, settings, checkpoint, console)
        result.placements = {
            name: [p.to_dict() for p in placement.get_placements(name)] for name in COMPONENTS
        }
        result.misplaced_bundles = _misplaced_bundles(live.layout)
        reporting.write_placement(output, {"components": result.placements, "relations": _relations(live)})
        _train(live, algo, settings, state, log, result, console, on_iteration)
    except KeyboardInterrupt:
        result.interrupted = True
    finally:
        with _sigint_ignored():  # a second Ctrl-C must not cut the cleanup short
            log.close()
            if live is not None:
                live.shutdown()
            if own_cluster and cluster is not None:
                cluster.shutdown()
            records = reporting.read_metrics(output)
            if settings.plot and records:
                title = f"PPO {algo.env_id}: {cfg.get('name') or output.name}"
                result.plot = reporting.plot_learning_curve(
                    records, output / reporting.PLOT_FILE, algo.target_return, title
                )
            result.wall_s = time.perf_counter() - started
    return result


def _show_plan(console: Console, cluster: Cluster, placement: ComponentPlacement, layout: LayoutPlan) -> None:
    """The same tables, map and layout as ``rlinfra plan``, for the live cluster and the placement
    group just reserved (and what each node holds of its CPUs), before any worker starts."""
    from rlinfra.cli.node_view import node_loads
    from rlinfra.cli.plan_view import render_plan

    cpus = [int(node.resources.get("CPU", 0)) for node in cluster.nodes]
    loads = node_loads(layout, cluster.spec.num_nodes, cpus)
    render_plan(console, cluster.spec, placement, layout, loads, show_all=False)
    console.print()


def env_spaces(env_id: str) -> tuple[int, int]:
    """Observation size and number of actions, from one throw-away env; a ``JobConfigError``
    naming ``algo.env_id`` if gymnasium does not know it or it is not a discrete-action env."""
    try:
        probe = gym.make(env_id)
    except gym.error.Error as error:
        raise JobConfigError(f"algo.env_id: {error}") from None
    try:
        if not isinstance(probe.action_space, gym.spaces.Discrete) or len(probe.observation_space.shape) != 1:
            raise JobConfigError(
                f"algo.env_id: {env_id!r} has {probe.action_space} actions and observations of shape "
                f"{probe.observation_space.shape}; expected discrete actions and flat observations"
            )
        return int(probe.observation_space.shape[0]), int(probe.action_space.n)
    finally:
        probe.close()


def _envs_per_worker(placement: ComponentPlacement, algo: PPOConfig) -> int:
    """The job's shape, checked before anything is reserved: the three components exist and the
    envs split evenly over the env workers."""
    missing = [name for name in COMPONENTS if name not in placement.components]
    if missing:
        raise PlacementError(
            f"the PPO job needs components {', '.join(COMPONENTS)}; missing {', '.join(missing)}",
            where="cluster.component_placement",
        )
    num_env_workers = placement.get_world_size("env")
    if algo.num_envs % num_env_workers:
        raise JobConfigError(
            f"algo.num_envs: {algo.num_envs} envs cannot be split evenly over {num_env_workers} env "
            f"workers; expected a multiple of {num_env_workers}"
        )
    return algo.num_envs // num_env_workers


def _launch(
    live: _Components,
    cluster: Cluster,
    placement: ComponentPlacement,
    algo: PPOConfig,
    spaces: tuple[int, int],
    envs_per_worker: int,
    settings: RunSettings,
    checkpoint: dict[str, Any] | None,
    console: Console,
) -> None:
    """The three groups in the reserved layout, the trainer's process group, the first weights on
    every rollout worker and the env → rollout wiring. On failure the caller's ``live.shutdown()``
    releases whatever started."""
    obs_dim, num_actions = spaces
    algo_dict = dataclasses.asdict(algo)
    options = {
        "layout": live.layout,
        "launch_timeout": settings.launch_timeout_s,
        "call_timeout": settings.call_timeout_s,
    }
    with console.status("starting workers"):
        live.env = EnvWorker.create_group(algo_dict, envs_per_worker, settings.request_timeout_s).launch(
            cluster, placement.get_strategy("env"), name="env", **options
        )
        live.actor = ActorWorker.create_group(algo_dict, obs_dim, num_actions).launch(
            cluster, placement.get_strategy("actor"), name="actor", **options
        )
        # Two threads: one serves the env workers, the other stages the next weights.
        live.rollout = RolloutWorker.create_group(algo_dict, obs_dim, num_actions).launch(
            cluster, placement.get_strategy("rollout"), name="rollout", max_concurrency=2, **options
        )
        bring_up(live.actor, backend="gloo")
        actor_bytes = checkpoint["actor"] if checkpoint else None
        versions = live.actor.setup(actor_bytes).wait()
        first = live.actor.execute_on(0).export_weights().wait()[0]
        live.rollout.set_initial_weights(first, versions[0]).wait()
        live.version = versions[0]
        _connect(live.env, live.rollout)


def _connect(env: Any, rollout: Any) -> None:
    """Each env worker talks to its own share of the rollout workers: with more rollout workers
    than env workers its envs are split among several, otherwise rollout workers are shared."""
    count_env, count_rollout = env.world_size, rollout.world_size
    for rank in env.ranks:
        mine = [r for r in rollout.ranks if r % count_env == rank] if count_rollout >= count_env else []
        mine = mine or [rank % count_rollout]
        env.execute_on(rank).connect([(f"rollout:{r}", rollout.actors[r]) for r in mine]).wait()


def _misplaced_bundles(layout: Layout) -> list[str]:
    """Ranks whose bundle Ray put on another node than planned (expected: none)."""
    return [
        f"{name}:{row.rank} planned on node {row.planned_node_rank}, placed on {row.node_rank}"
        for name in COMPONENTS
        for row in layout.bundle_report(name)
        if not row.matches
    ]


def _relations(live: _Components) -> dict[str, str]:
    plan = live.layout.plan
    return {
        "actor-rollout": plan.relation("actor", "rollout"),
        "rollout-env": plan.relation("rollout", "env"),
    }


# ------------------------------------------------------------------------------------ training loop
@dataclass
class _DriverState:
    """What the driver carries across iterations, and across a resume through the checkpoint."""

    iteration: int
    env_steps: int
    training_s: float
    time_to_target_s: float | None
    returns: collections.deque[float]

    @classmethod
    def restore(cls, saved: Mapping[str, Any] | None, window: int) -> _DriverState:
        saved = saved or {}
        return cls(
            iteration=int(saved.get("iteration", 0)),
            env_steps=int(saved.get("env_steps", 0)),
            training_s=float(saved.get("training_s", 0.0)),
            time_to_target_s=saved.get("time_to_target_s"),
            returns=collections.deque(saved.get("returns", []), maxlen=window),
        )

    def mean_return(self) -> float:
        return sum(self.returns) / len(self.returns) if self.returns else math.nan

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["returns"] = list(self.returns)
        return data


class _TrainingLoop:
    """The driver's side of PPO: rollouts in, one update per iteration, new weights out."""

    def __init__(
        self,
        live: _Components,
        algo: PPOConfig,
        settings: RunSettings,
        state: _DriverState,
        result: JobResult,
    ) -> None:
        self.live, self.algo, self.settings, self.state, self.result = live, algo, settings, state, result
        self.overlap = algo.max_staleness >= 1
        self.learner_version = live.version
        self.sync = WeightSync(
            live.actor,
            live.rollout,
            transport=settings.transport,
            initial_version=live.version,
            step_timeout_s=settings.call_timeout_s,
        )
        result.served_versions.append(self.sync.version)
        self.staged: Prepared | None = None
        self.sync_s = {"prepare_s": 0.0, "pause_s": 0.0, "held_s": 0.0}

    def iterations(self) -> Iterator[dict[str, Any]]:
        """Run until the target return or the iteration budget; yield each iteration's record."""
        state, algo = self.state, self.algo
        clock = time.perf_counter()
        pending = self.live.env.collect()
        while state.iteration < algo.iterations:
            waited = time.perf_counter()
            rollouts = pending.wait()
            collect_s = time.perf_counter() - waited
            self._commit_staged()  # between rollouts: nothing in flight, no batch can mix versions
            more = state.iteration + 1 < algo.iterations
            if self.overlap and more:
                pending = self.live.env.collect()  # on the newest weights, while the actor trains
            trained = time.perf_counter()
            record = self._learn(rollouts)
            train_s = time.perf_counter() - trained
            if not self.overlap:
                self._commit_staged()
                if more:
                    pending = self.live.env.collect()
            now = time.perf_counter()
            state.training_s += now - clock
            clock = now
            state.iteration += 1
            yield self._finish_record(record, collect_s, train_s)

    def _commit_staged(self) -> None:
        """Pause → swap → verify → resume for the version staged last iteration, if any."""
        if self.staged is not None:
            report = self.sync.commit(self.staged)
            self.sync_s["pause_s"], self.sync_s["held_s"] = report.pause_s, report.held_s
            self.result.served_versions.append(self.sync.version)
            self.staged = None

    def _learn(self, rollouts: list[dict[str, Any]]) -> dict[str, Any]:
        """Drop rollouts older than ``max_staleness``, train on the rest, stage the new version
        (``prepare`` runs while the env and rollout workers keep generating)."""
        stamped = [Stamped(r["versions"][0], r["batch"]) for r in rollouts]
        oldest = min(s.version for s in stamped)
        fresh, dropped = filter_stale(stamped, self.learner_version, self.algo.max_staleness)
        self.result.dropped_batches += dropped
        self.result.batch_versions.append([r["versions"][0] for r in rollouts])
        for rollout in rollouts:
            self.state.returns.extend(rollout["episode_returns"])
        self.state.env_steps += sum(r["transitions"] for r in rollouts)
        record: dict[str, Any] = {
            "batch_version": oldest,
            "staleness": self.learner_version - oldest,
            "dropped": dropped,
        }
        if fresh:
            metrics = self.live.actor.train([s.value for s in fresh]).wait()[0]
            self.learner_version = int(metrics.pop("weight_version"))
            self.staged = self.sync.prepare(self.learner_version)
            self.sync_s["prepare_s"] = self.staged.prepare_s
            record |= {key: round(value, 5) for key, value in metrics.items()}
        return record

    def _finish_record(self, learned: dict[str, Any], collect_s: float, train_s: float) -> dict[str, Any]:
        state = self.state
        mean_return = state.mean_return()
        if state.time_to_target_s is None and mean_return >= self.algo.target_return:
            state.time_to_target_s = state.training_s
        record = {
            "iteration": state.iteration,
            "env_steps": state.env_steps,
            "time_s": round(state.training_s, 3),
            "mean_return": mean_return,
            "episodes": len(state.returns),
            "batch_version": learned.pop("batch_version"),
            "learner_version": self.learner_version,
            "served_version": self.sync.version,
            "collect_s": round(collect_s, 4),
            "train_s": round(train_s, 4),
            "sync_s": round(self.sync_s["prepare_s"] + self.sync_s["pause_s"], 4),
            "pause_s": round(self.sync_s["pause_s"], 5),  # the driver's view of the commit
            "held_s": round(self.sync_s["held_s"], 5),  # the longest a rollout worker's gate was closed
            "steps_per_s": round(state.env_steps / state.training_s, 1),
        } | learned
        if state.iteration % self.settings.checkpoint_every == 0:
            record["replicas_in_sync"] = _replicas_in_sync(self.live, state.iteration)
        return record


def _train(
    live: _Components,
    algo: PPOConfig,
    settings: RunSettings,
    state: _DriverState,
    log: reporting.MetricsLog,
    result: JobResult,
    console: Console,
    on_iteration: Callable[[dict[str, Any]], None] | None,
) -> None:
    """Iterate, and after each iteration: log, checkpoint, show progress, stop at the target."""
    loop = _TrainingLoop(live, algo, settings, state, result)
    ctrl_c = _CtrlC()
    with ctrl_c.watching(), _progress(console, algo.iterations, state.iteration) as (progress, task):
        for record in loop.iterations():
            log.write(record)
            _after_iteration(live, settings, state, result, record)
            progress.update(task, completed=state.iteration, status=_status(record))
            console.print(_line(record), highlight=False, soft_wrap=True)
            if on_iteration is not None:
                on_iteration(record)
            if ctrl_c.pressed:  # its KeyboardInterrupt was swallowed somewhere: stop here
                raise KeyboardInterrupt
            if record["mean_return"] >= algo.target_return:
                result.solved = True
                break


def _replicas_in_sync(live: _Components, iteration: int) -> bool:
    """Data parallelism must keep every actor rank's parameters bit-identical; rank 0 alone is
    checkpointed and published, so a divergence would go unseen. Stop rather than train on."""
    digests = live.actor.parameters_digest().wait()
    if len(set(digests)) != 1:
        raise RuntimeError(
            f"actor replicas diverged at iteration {iteration}: parameter digests "
            + ", ".join(f"rank {rank}: {digest[:12]}" for rank, digest in enumerate(digests))
        )
    return True


def _after_iteration(
    live: _Components, settings: RunSettings, state: _DriverState, result: JobResult, record: dict[str, Any]
) -> None:
    result.iterations, result.env_steps, result.training_s = (
        state.iteration,
        state.env_steps,
        state.training_s,
    )
    result.time_to_target_s = state.time_to_target_s
    result.mean_return = record["mean_return"]
    if math.isnan(result.first_mean_return):
        result.first_mean_return = record["mean_return"]
    if state.iteration % settings.checkpoint_every == 0:
        actor_state = live.actor.execute_on(0).checkpoint().wait()[0]
        reporting.save_checkpoint(result.output_dir, actor_state, state.to_dict())


def _status(record: dict[str, Any]) -> str:
    return (
        f"return {_num(record['mean_return'])} | weights v{record['served_version']} | "
        f"sync {record['sync_s'] * 1e3:.0f} ms | {record['steps_per_s']:.0f} steps/s"
    )


def _line(record: dict[str, Any]) -> str:
    return (
        f"iter {record['iteration']:3d} | steps {record['env_steps']:6d} | return "
        f"{_num(record['mean_return'])} | batch v{record['batch_version']} → learner "
        f"v{record['learner_version']} | serving v{record['served_version']} | collect "
        f"{record['collect_s']:.2f} s train {record['train_s']:.2f} s sync {record['sync_s'] * 1e3:.0f} ms"
    )


def _num(value: float) -> str:
    return "   n/a" if value is None or math.isnan(value) else f"{value:6.1f}"


@contextlib.contextmanager
def _progress(console: Console, total: int, done: int) -> Iterator[tuple[Progress, Any]]:
    columns = (
        TextColumn("[bold]PPO"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[status]}"),
        TimeElapsedColumn(),
    )
    # Without a terminal (CI, a pipe) the per-iteration lines say it all; a bar would only be
    # printed once, at the end, cut to 80 columns.
    with Progress(*columns, console=console, transient=False, disable=not console.is_terminal) as progress:
        yield progress, progress.add_task("train", total=total, completed=done, status="starting")


class _CtrlC:
    """Ctrl-C raises ``KeyboardInterrupt`` as usual and is also remembered, so that code which
    swallows the exception cannot make the job ignore it: the loop then stops at the end of the
    iteration. (Seen once in a full test run: a SIGINT during an iteration was lost somewhere below
    the driver's code and training went on to the end.)"""

    def __init__(self) -> None:
        self.pressed = False

    def _handler(self, signum: int, frame: Any) -> None:
        self.pressed = True
        raise KeyboardInterrupt

    def watching(self) -> contextlib.AbstractContextManager[None]:
        return _sigint_handled_by(self._handler)


@contextlib.contextmanager
def _sigint_handled_by(handler: Any) -> Iterator[None]:
    """Inside the block SIGINT goes to ``handler`` (a function or ``signal.SIG_IGN``); the
    previous handler is back afterwards."""
    try:
        previous = signal.signal(signal.SIGINT, handler)
    except ValueError:  # not the main thread: signals are not ours to manage
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@contextlib.contextmanager
def _sigint_ignored() -> Iterator[None]:
    """Hold off Ctrl-C while releasing workers and placement groups (bounded: seconds)."""
    with _sigint_handled_by(signal.SIG_IGN):
        yield
