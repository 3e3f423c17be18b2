"""The main job's speed: time-to-475 and env steps/s of both bundled layouts vs single-process PPO.

Baseline, measured in the same run: ``examples/ppo_cartpole/ppo/train_local.py`` — the same PPO
(same hyperparameters and seed) in one process, with no Ray, no IPC and no weight sync; the
physical limit of this machine for this algorithm. Each layout runs as a user runs it
(``rlinfra run CONFIG``, a fresh embedded Ray with simulated nodes, in a subprocess); its
time-to-target is read from the job's own metrics (training time, from the first rollout), and
the wall time of the whole command (Ray start, launch, teardown) is reported beside it.
Goal (issue 7): mean return >= 475 within 5 minutes on 2 cores, for both layouts.
The last line printed is one JSON object with every figure.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the job lives in examples/, which is not an installed package

import harness  # noqa: E402

from benchmarks.bundled_job import run_bundled  # noqa: E402
from examples.ppo_cartpole.ppo.config import PPOConfig  # noqa: E402
from examples.ppo_cartpole.ppo.train_local import train  # noqa: E402
from rlinfra.driver import read_metrics  # noqa: E402

LAYOUTS = ("disaggregated", "colocated")
GOAL_S = 300.0
SMOKE_ITERATIONS = 2  # --smoke: the first layout only, this many iterations (the target is not reached)


def run_local(seed: int, iterations: int) -> dict[str, float]:
    result = train(PPOConfig(seed=seed, iterations=iterations), log=lambda _: None)
    return {
        "solved": result.solved,
        "time_to_target_s": round(result.seconds, 2),
        "wall_s": round(result.seconds, 2),
        "iterations": result.iterations,
        "env_steps": result.env_steps,
        "steps_per_s": round(result.env_steps / result.seconds, 1),
    }


def run_layout(name: str, seed: int, folder: Path, iterations: int) -> dict[str, float]:
    overrides = (f"algo.iterations={iterations}",)
    output, wall = run_bundled("ppo_cartpole", name, seed, folder, timeout_s=GOAL_S * 2, overrides=overrides)
    records = read_metrics(output)
    last = records[-1]
    solved = [r for r in records if (r["mean_return"] or 0) >= PPOConfig().target_return]
    return {
        "solved": bool(solved),
        "time_to_target_s": solved[0]["time_s"] if solved else None,
        "wall_s": round(wall, 2),
        "iterations": last["iteration"],
        "env_steps": last["env_steps"],
        "steps_per_s": last["steps_per_s"],
        "mean_sync_ms": round(1e3 * sum(r["sync_s"] for r in records) / len(records), 1),
        "mean_pause_ms": round(1e3 * sum(r["pause_s"] for r in records) / len(records), 2),
    }


def main() -> None:
    parser = harness.parser(__doc__)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    iterations = SMOKE_ITERATIONS if args.smoke else PPOConfig().iterations
    layouts = LAYOUTS[:1] if args.smoke else LAYOUTS
    rows = {"local": run_local(args.seed, iterations)}
    with tempfile.TemporaryDirectory() as folder:
        for name in layouts:
            rows[name] = run_layout(name, args.seed, Path(folder), iterations)
    local = rows["local"]
    print(f"{'layout':<14} {'solved':>6} {'time-to-475':>12} {'wall':>8} {'steps/s':>8} {'vs local':>9}")
    for name, row in rows.items():
        ttt = row["time_to_target_s"]
        if name != "local" and ttt is not None and local["time_to_target_s"] is not None:
            row["time_ratio_vs_local"] = round(ttt / local["time_to_target_s"], 2)
            row["throughput_ratio_vs_local"] = round(row["steps_per_s"] / local["steps_per_s"], 3)
        print(
            f"{name:<14} {row['solved']!s:>6} {ttt if ttt is not None else '-':>11}s "
            f"{row['wall_s']:>7}s {row['steps_per_s']:>8} {row.get('time_ratio_vs_local', 1.0):>8}x"
        )
    within_goal = all(rows[name]["solved"] and rows[name]["wall_s"] <= GOAL_S for name in layouts)
    harness.emit(
        {"benchmark": "ppo_cartpole", "goal_s": GOAL_S, "within_goal": within_goal, "rows": rows}, args.smoke
    )


if __name__ == "__main__":
    main()
