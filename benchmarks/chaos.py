"""The main job under faults: both bundled layouts trained to 475 while workers are SIGKILLed.

Per layout, on one embedded Ray shared by both runs: a fault-free run (the baseline, measured in the
same invocation), then a chaos run in which a driver thread SIGKILLs a random rollout or env worker
every ``--every-s`` seconds and, once, a trainer rank (``actor:1``, at the first kill after half the
fault-free time-to-target). Killing starts at the first finished iteration (every worker is up) and
stops when the target is reached; one fault at a time (a kill due while the last victim is still
being recovered is skipped, and reported). Restart budgets are raised for both runs, so the budget
is not what is measured. Reported: whether 475 was reached, time-to-target (the job's training time) and
wall time as ratios to the fault-free run, each recovery's time from the kill to the end of the
recovery that replaced the victim (admitted at the committed version, rewired: serving), batches
lost / dropped / rolled back / duplicated, and the restarts used.
Goals (2 cores): 475 under chaos within 2x the fault-free time; a rollout replacement
serves within 10 s of the death. The last line printed is one JSON object with every figure.
"""

from __future__ import annotations

import json
import os
import random
import signal
import statistics
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import harness
import ray
from omegaconf import DictConfig, OmegaConf
from rich.console import Console

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the job lives in examples/, which is not an installed package

from examples.ppo_cartpole.job import PPOJob  # noqa: E402
from rlinfra import Cluster, ComponentPlacement  # noqa: E402
from rlinfra.config.loading import load_config  # noqa: E402
from rlinfra.driver import RunResult  # noqa: E402
from rlinfra.driver.failure_report import REPORT_FILE  # noqa: E402
from rlinfra.driver.supervisor import Recovery  # noqa: E402

EXAMPLE = ROOT / "examples" / "ppo_cartpole"
LAYOUTS = ("disaggregated", "colocated")
REPLACEABLE = ("rollout", "env")  # replaced in place by the supervisor
TRAINER = "actor:1"  # restarted with its whole group from the last checkpoint
TRAINER_FALLBACK_KILL = 3  # which kill is the trainer's when there is no fault-free time to halve
RESTART_BUDGET = 100  # per component; the YAMLs' 3 would stop a chaos run, which is not the point
GOAL_RATIO = 2.0
GOAL_ROLLOUT_S = 10.0
PID_TIMEOUT_S = 30.0
SMOKE_ITERATIONS, SMOKE_EVERY_S = 6, 2.0  # --smoke: the first layout, a kill or two, no target


def job_config(layout: str, output: Path, iterations: int) -> DictConfig:
    """The bundled config with this benchmark's overrides. The restart budgets are set on the object:
    the colocated key ``actor,rollout`` holds a comma, which a dotlist cannot name."""
    overrides = [f"run.output_dir={output}", "run.plot=false", f"algo.iterations={iterations}"]
    cfg = OmegaConf.merge(load_config(EXAMPLE / f"{layout}.yaml"), OmegaConf.from_dotlist(overrides))
    for entry in cfg.cluster.component_placement.values():
        if isinstance(entry, DictConfig) and "restart" in entry:
            entry.restart.max = RESTART_BUDGET
    return cfg


def victims(cfg: DictConfig, cluster: Cluster) -> list[str]:
    """The replaceable workers' actor names, from the placement itself rather than a hard-coded list."""
    placement = ComponentPlacement(cfg, cluster)
    return [f"{name}:{rank}" for name in REPLACEABLE for rank in range(placement.get_world_size(name))]


@dataclass
class Kill:
    at: float  # Unix time, right after the signal was sent
    victim: str
    pid: int
    since_start_s: float  # since the chaos thread started


@dataclass
class Chaos:
    """A driver thread that SIGKILLs one worker every ``every_s`` seconds, started by the first
    ``on_iteration`` (so every worker is up) and stopped at the target or when ``run`` returns.

    One fault at a time: a kill is skipped while the previous victim is being recovered, i.e. until
    it answers with a new pid and an iteration has ended after that (the driver heals between
    iterations, so that iteration's end is after the heal). Ray registers a replacement's name while
    its constructor still runs, so looking it up does not tell; killing it there is a second fault
    within one recovery, which this benchmark does not measure. A victim that cannot be looked up is
    skipped, and any error is recorded, never fatal to the thread."""

    victims: list[str]
    every_s: float
    seed: int
    target_return: float
    trainer_after_s: float | None  # kill the trainer at the first kill this long after the start
    kills: list[Kill] = field(default_factory=list)
    skipped: list[dict[str, Any]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)
        self._stop = threading.Event()
        self._ended = threading.Condition()  # notified at each iteration's end
        self._iterations = 0
        self._thread: threading.Thread | None = None
        self._started = 0.0
        self._trainer_killed = False
        self._recovering: Kill | None = None  # the last victim, until it is back

    def on_iteration(self, record: dict[str, Any]) -> None:
        if self._thread is None:
            self._started = time.time()
            self._thread = threading.Thread(target=self._loop, name="chaos", daemon=True)
            self._thread.start()
        if record["mean_return"] >= self.target_return:  # PPOJob.run() returns now: no kill during teardown
            self._stop.set()
        with self._ended:
            self._iterations += 1
            self._ended.notify_all()

    def stop(self) -> None:
        self._stop.set()
        with self._ended:
            self._ended.notify_all()
        if self._thread is not None:
            self._thread.join()

    def _loop(self) -> None:
        next_at = time.monotonic() + self.every_s
        while True:
            try:
                if self._recovering is not None:
                    self._watch_recovery(next_at)
                if self._stop.wait(max(0.0, next_at - time.monotonic())):
                    return
                next_at += self.every_s
                self._strike()
            except Exception as error:  # recorded, reported; the next interval still comes
                self.errors.append(f"{type(error).__name__}: {error}")

    def _watch_recovery(self, deadline: float) -> None:
        """Until ``deadline``: at each iteration's end, ask the last victim for its pid; once it is
        a new one, the next iteration's end clears it."""
        kill = self._recovering
        assert kill is not None
        seen = self._iterations
        while self._next_iteration(seen, deadline):
            seen = self._iterations
            if self._pid(kill.victim, max(0.1, deadline - time.monotonic())) not in (None, kill.pid):
                if self._next_iteration(seen, deadline):
                    self._recovering = None
                return

    def _next_iteration(self, seen: int, deadline: float) -> bool:
        """Wait until an iteration after the ``seen``-th has ended; False at the deadline or stop."""
        with self._ended:
            self._ended.wait_for(
                lambda: self._iterations > seen or self._stop.is_set(),
                timeout=max(0.0, deadline - time.monotonic()),
            )
            return self._iterations > seen and not self._stop.is_set()

    @staticmethod
    def _pid(victim: str, timeout: float) -> int | None:
        """The victim's pid, or None while it is dead or not yet constructed."""
        try:
            return int(ray.get(ray.get_actor(victim).rlinfra_ready.remote(), timeout=timeout)["pid"])
        except Exception:
            return None

    def _trainer_due(self, elapsed: float) -> bool:
        if self._trainer_killed:
            return False
        if self.trainer_after_s is not None:
            return elapsed >= self.trainer_after_s
        return len(self.kills) + 1 >= TRAINER_FALLBACK_KILL

    def _skip(self, victim: str, elapsed: float, reason: str) -> None:
        self.skipped.append({"victim": victim, "since_start_s": round(elapsed, 2), "reason": reason})

    def _strike(self) -> None:
        elapsed = time.time() - self._started
        if self._recovering is not None:
            self._skip("-", elapsed, f"{self._recovering.victim} is still being recovered")
            return
        trainer = self._trainer_due(elapsed)
        victim = TRAINER if trainer else self._rng.choice(self.victims)
        try:
            pid = int(ray.get(ray.get_actor(victim).rlinfra_ready.remote(), timeout=PID_TIMEOUT_S)["pid"])
            if self._stop.is_set():  # the target was reached while the victim answered
                return
            os.kill(pid, signal.SIGKILL)
        except Exception as error:  # not up: dead and not yet noticed, or being replaced
            self._skip(victim, elapsed, f"{type(error).__name__}: {(str(error).splitlines() or [''])[0]}")
            return
        kill = Kill(time.time(), victim, pid, round(time.time() - self._started, 2))
        self.kills.append(kill)
        self._recovering = kill
        self._trainer_killed = self._trainer_killed or trainer


def attempt(cfg: DictConfig, cluster: Cluster, chaos: Chaos | None) -> tuple[RunResult | None, str | None]:
    """One run of the job; a failure is reported (traceback printed), not raised, so the other runs
    still happen and the JSON still comes."""
    try:
        hook = chaos.on_iteration if chaos is not None else None
        return PPOJob.run(cfg, cluster=cluster, console=Console(quiet=True), on_iteration=hook), None
    except Exception as error:
        traceback.print_exc(file=sys.stdout)
        sys.stdout.flush()
        return None, f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
    finally:
        if chaos is not None:
            chaos.stop()


def summary(result: RunResult | None, error: str | None, output: Path) -> dict[str, Any]:
    """The figures of one run, from the job's own result; for a failed run, what its failure
    report says was tried and how the batches ended."""
    if result is None:
        report_path = output / REPORT_FILE
        report = json.loads(report_path.read_text()) if report_path.exists() else {}
        attempts = [
            {key: a.get(key) for key in ("component", "rank", "at", "took_s", "outcome")}
            for a in report.get("attempts", [])
        ]
        batches = report.get("details", {}).get("batches")
        return {"solved": False, "error": error, "attempts": attempts, "batches": batches}
    state = result.state
    replaced = [r for recovery in state.recoveries for r in recovery.restarts if r.outcome == "replaced"]
    ttt = result.time_to_target_s
    return {
        "solved": result.outcome == "target",
        "time_to_target_s": round(ttt, 2) if ttt is not None else None,
        "wall_s": round(result.wall_s, 2),
        "iterations": result.iterations,
        "env_steps": result.state.env_steps,
        "batches": result.batches,
        "recoveries": len(state.recoveries),
        "replacements": len(replaced),
        "replacement_attempts": sum(len(recovery.restarts) for recovery in state.recoveries),
        "trainer_restarts": sum(r.outcome == "restarted" for r in state.trainer_restarts),
    }


def recovery_times(kills: list[Kill], result: RunResult | None) -> list[dict[str, Any]]:
    """Each kill → the end of the recovery that replaced that victim: the first replacement of the
    same component and rank started after the kill; its ``Recovery.finished_at`` is when the newcomer
    was admitted at the committed version and rewired, i.e. serving. For the trainer: the end of its
    restart from the checkpoint (re-published weights included)."""
    rows = []
    recoveries: list[Recovery] = result.state.recoveries if result is not None else []
    trainer = result.state.trainer_restarts if result is not None else []
    for kill in kills:
        component, rank = kill.victim.split(":")[0], int(kill.victim.split(":")[1])
        ready: float | None = None
        if component == "actor":
            restarts = [r for r in trainer if r.outcome == "restarted" and r.at >= kill.at]
            if restarts:
                first = min(restarts, key=lambda r: r.at)
                ready = first.at + first.took_s
        else:
            matches = [
                (restart.at, recovery.finished_at)
                for recovery in recoveries
                for restart in recovery.restarts
                if (restart.component, restart.rank) == (component, rank)
                and restart.outcome == "replaced"
                and restart.at >= kill.at
            ]
            if matches:
                ready = min(matches)[1]
        rows.append(
            {
                "victim": kill.victim,
                "killed_after_s": kill.since_start_s,
                "recovered_s": round(ready - kill.at, 2) if ready is not None else None,
            }
        )
    return rows


def ratio(chaos: float | None, base: float | None) -> float | None:
    return round(chaos / base, 3) if chaos is not None and base else None


def spread(values: list[float]) -> dict[str, float | None]:
    return {
        "max_s": round(max(values), 2) if values else None,
        "median_s": round(statistics.median(values), 2) if values else None,
    }


def run_layout(layout: str, every_s: float, seed: int, iterations: int, folder: Path) -> dict[str, Any]:
    """Fault-free, then chaos, on one cluster; the row of figures and the goals."""
    base_cfg = job_config(layout, folder / f"{layout}-fault-free", iterations)
    chaos_cfg = job_config(layout, folder / f"{layout}-chaos", iterations)
    cluster = Cluster(base_cfg["cluster"])
    try:
        names = victims(base_cfg, cluster)
        base = summary(*attempt(base_cfg, cluster, None), Path(base_cfg.run.output_dir))
        base_ttt = base.get("time_to_target_s")
        chaos = Chaos(
            names,
            every_s,
            seed,
            float(chaos_cfg.algo.target_return),
            base_ttt / 2 if base_ttt is not None else None,
        )
        result, error = attempt(chaos_cfg, cluster, chaos)
    finally:
        cluster.shutdown()
    under = summary(result, error, Path(chaos_cfg.run.output_dir))
    recovered = recovery_times(chaos.kills, result)
    replaced = [
        r["recovered_s"] for r in recovered if r["recovered_s"] is not None and r["victim"] != TRAINER
    ]
    rollout = [r["recovered_s"] for r in recovered if r["victim"].startswith("rollout:")]
    trainer = [r["recovered_s"] for r in recovered if r["victim"] == TRAINER and r["recovered_s"] is not None]
    time_ratio = ratio(under.get("time_to_target_s"), base_ttt)
    goals = {
        "target_within_2x": bool(under["solved"] and time_ratio is not None and time_ratio <= GOAL_RATIO),
        # None: no rollout worker was killed, so the goal was not measured
        "rollout_serves_within_10s": (
            all(s is not None and s <= GOAL_ROLLOUT_S for s in rollout) if rollout else None
        ),
    }
    return {
        "layout": layout,
        "victims": names,
        "fault_free": base,
        "chaos": under,
        "time_to_target_ratio": time_ratio,
        "wall_ratio": ratio(under.get("wall_s"), base.get("wall_s")),
        "kills": [asdict(kill) for kill in chaos.kills],
        "skipped_kills": chaos.skipped,
        "chaos_thread_errors": chaos.errors,
        "recovery_s": recovered,
        "recovery": spread(replaced),  # rollout and env replacements
        "rollout_recovery": spread([s for s in rollout if s is not None]),
        "trainer_recovery_s": trainer,
        "unrecovered_kills": sum(r["recovered_s"] is None for r in recovered),
        "goals": goals,
    }


def show(row: dict[str, Any]) -> None:
    """The figures of one layout, in words."""

    def run_line(label: str, figures: dict[str, Any], time_ratio: Any = None, wall_ratio: Any = None) -> str:
        if "error" in figures:
            return f"  {label:<11} FAILED: {figures['error']}"
        ttt = figures["time_to_target_s"]
        ratios = f" ({time_ratio}x)" if time_ratio is not None else ""
        walls = f" ({wall_ratio}x)" if wall_ratio is not None else ""
        return (
            f"  {label:<11} solved {figures['solved']!s:<5} time-to-475 "
            f"{f'{ttt} s' if ttt is not None else '-'}{ratios}, wall {figures['wall_s']} s{walls}, "
            f"{figures['iterations']} iterations"
        )

    print(row["layout"])
    print(run_line("fault-free", row["fault_free"]))
    print(run_line("chaos", row["chaos"], row["time_to_target_ratio"], row["wall_ratio"]))
    kills = ", ".join(f"{k['victim']} @{k['since_start_s']}s" for k in row["kills"]) or "none"
    print(f"  kills       {len(row['kills'])}: {kills}")
    print(f"  skipped     {len(row['skipped_kills'])}, chaos thread errors {len(row['chaos_thread_errors'])}")
    times = ", ".join(
        f"{r['victim']} " + (f"{r['recovered_s']} s" if r["recovered_s"] is not None else "never")
        for r in row["recovery_s"]
    )
    recovery, rollout = row["recovery"], row["rollout_recovery"]
    print(f"  recoveries  {times or 'none'}")
    print(
        f"              replacements: max {recovery['max_s']} s, median {recovery['median_s']} s; "
        f"rollout max {rollout['max_s']} s; trainer {row['trainer_recovery_s']} s"
    )
    if "error" not in row["chaos"]:
        chaos = row["chaos"]
        batches = chaos["batches"]
        print(
            f"  batches     issued {batches['issued']}, trained {batches['trained']}, "
            f"lost {batches['lost']}, dropped {batches['dropped']}, rolled back {batches['rolled_back']}, "
            f"open {batches['open']}, duplicated {batches['duplicated']}"
        )
        print(
            f"  restarts    {chaos['replacements']} replacement(s) "
            f"({chaos['replacement_attempts']} attempt(s)), {chaos['trainer_restarts']} trainer restart(s)"
        )
    else:  # the run stopped: what its failure report says was tried before
        tried = ", ".join(
            f"{a['component']}:{a['rank']} {a['outcome']} in {a['took_s']:.1f} s"
            for a in row["chaos"]["attempts"]
        )
        print(f"  tried       {tried or 'nothing'}; batches {row['chaos']['batches']}")
    goals = row["goals"]
    verdict = {True: "PASS", False: "FAIL", None: "n/a "}
    print(
        f"  {verdict[goals['target_within_2x']]}  475 under chaos within {GOAL_RATIO:g}x the fault-free time"
    )
    print(
        f"  {verdict[goals['rollout_serves_within_10s']]}  a rollout replacement serves within "
        f"{GOAL_ROLLOUT_S:g} s of the death"
    )


def main() -> None:
    parser = harness.parser(__doc__)
    parser.add_argument("--layouts", nargs="+", choices=LAYOUTS, default=list(LAYOUTS))
    parser.add_argument("--every-s", type=float, default=10.0, help="seconds between kills")
    parser.add_argument("--seed", type=int, default=0, help="the random choice of victims")
    parser.add_argument("--iterations", type=int, default=150, help="the job's iteration budget")
    args = parser.parse_args()
    if args.smoke:
        args.layouts, args.iterations, args.every_s = args.layouts[:1], SMOKE_ITERATIONS, SMOKE_EVERY_S
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for layout in args.layouts:
            row = run_layout(layout, args.every_s, args.seed, args.iterations, Path(folder))
            show(row)
            rows.append(row)
    figures = {
        "benchmark": "chaos",
        "every_s": args.every_s,
        "seed": args.seed,
        "goal_ratio": GOAL_RATIO,
        "goal_rollout_s": GOAL_ROLLOUT_S,
        "rows": rows,
        "all_goals_met": all(goal is True for row in rows for goal in row["goals"].values()),
    }
    harness.emit(figures, args.smoke)


if __name__ == "__main__":
    main()
