"""Shared checks for the main-job tests: configs with overrides, the dry-run plan, released resources."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import ray
from omegaconf import DictConfig, OmegaConf
from typer.testing import CliRunner

from rlinfra.cli.main import app
from rlinfra.config.loading import load_config
from rlinfra.driver.checkpoints import CheckpointStore
from rlinfra.driver.metrics import TENSORBOARD_DIR

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
EXAMPLE = EXAMPLES / "ppo_cartpole"


def job_config(name: str, *overrides: str, example: str = "ppo_cartpole") -> DictConfig:
    path = EXAMPLES / example / f"{name}.yaml"
    return OmegaConf.merge(load_config(path), OmegaConf.from_dotlist(list(overrides)))


def planned_placements(name: str, example: str = "ppo_cartpole") -> dict[str, list[dict[str, Any]]]:
    """What ``rlinfra plan --json`` says for the bundled config, without any cluster."""
    out = CliRunner().invoke(app, ["plan", str(EXAMPLES / example / f"{name}.yaml"), "--json"])
    assert out.exit_code == 0, out.output
    plan = json.loads(out.output)
    return {name: component["placements"] for name, component in plan["components"].items()}


def assert_resources_released(timeout_s: float = 30.0) -> None:
    """Every placement group removed and every CPU/GPU free again. Ray frees them asynchronously
    and offers no event for it, so this polls against a deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        total, free = ray.cluster_resources(), ray.available_resources()
        busy = {key: total[key] - free.get(key, 0.0) for key in ("CPU", "GPU") if key in total}
        live_groups = [
            pg_id for pg_id, info in ray.util.placement_group_table().items() if info["state"] != "REMOVED"
        ]
        if not live_groups and not any(busy.values()):
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"still held after {timeout_s} s: resources {busy}, groups {live_groups}")
        time.sleep(0.2)


def sigkill(actor_name: str) -> int:
    """SIGKILL the process of a live named rlinfra worker (it tells its pid when asked if ready)."""
    pid = ray.get(ray.get_actor(actor_name).rlinfra_ready.remote(), timeout=30)["pid"]
    os.kill(pid, signal.SIGKILL)
    return pid


# The GRPO tests start from a warm-up checkpoint the job made (tests/fixtures/grpo_start: held-out
# accuracy 0.31 after 1,051 supervised steps; about 3 minutes to make on 2 cores), given as
# model.path; the test that goes through the job's own warm-up makes a tiny one instead.
GRPO_START = EXAMPLES.parent / "tests" / "fixtures" / "grpo_start"
GRPO_TINY_WARMUP = (
    "algo.warmup_max_steps=20",
    "algo.warmup_eval_every=10",
    "algo.warmup_eval_size=20",
    "algo.warmup_target_accuracy=0.2",
)


def grpo_config(
    layout: str, output_dir: Path, *overrides: str, start: Path | None = GRPO_START
) -> DictConfig:
    """A short GRPO run of ``layout`` (the bundled YAML) writing to ``output_dir``: it runs every
    update asked for (no stop at the target), evaluates on 100 held-out prompts, and starts from
    ``start`` (``model.path``; None: the job's own warm-up, e.g. with ``GRPO_TINY_WARMUP``)."""
    return job_config(
        layout,
        "algo.stop_at_target=false",
        "algo.eval_size=100",
        *([f"model.path={start}"] if start is not None else []),
        f"run.output_dir={output_dir}",
        *overrides,
        example="grpo_lm",
    )


def assert_reward_improves(records: list[dict], window: int = 20, by: float = 0.02) -> None:
    """GRPO learns: the training reward's mean over the last ``window`` updates beats that over
    the first ``window`` by ``by``. Measured from the start checkpoint over 60 updates (seed 0,
    both layouts): +0.07 to +0.08, where the noise of the difference is about 0.016, so ``by`` sits
    some 4 standard deviations below the expected gain and far above no learning at all."""
    rewards = [record["reward_mean"] for record in records]
    assert len(rewards) >= 2 * window, f"need {2 * window} updates, got {len(rewards)}"
    first, last = sum(rewards[:window]) / window, sum(rewards[-window:]) / window
    assert last >= first + by, f"reward {first:.3f} over the first {window} updates, {last:.3f} over the last"


def load_checkpoint(folder: Path) -> dict[str, Any]:
    """``{"actor": bytes, "driver": state}`` of the last checkpoint a job saved in ``folder``."""
    saved = CheckpointStore(folder).load_latest()
    assert saved is not None, f"no checkpoint in {folder}"
    return {"actor": saved.payloads["actor"], "driver": saved.state}


def read_tensorboard(folder: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar in ``folder/tensorboard``, as TensorBoard would show it: tag -> [(step, value)]
    in step order, purged steps gone."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(folder / TENSORBOARD_DIR), size_guidance={"scalars": 0})
    events.Reload()
    return {
        tag: [(event.step, event.value) for event in events.Scalars(tag)] for tag in events.Tags()["scalars"]
    }
