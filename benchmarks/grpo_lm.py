"""The GRPO job's figures: both bundled layouts against the same GRPO in one process.

Baselines, measured in the same run:
- ``examples/grpo_lm/lm/train_local.py``: the same GRPO (same hyperparameters, seed and cached
  warm-up checkpoint) in one process, no Ray, no weight sync: the physical limit of this machine;
- the same model's ``generate`` (Hugging Face, KV cache, sampling) in one process, on one step's
  whole batch (prompts_per_step x G): what one process makes of the work the job's engines share.

Each layout runs as a user runs it (``rlinfra run CONFIG`` in a subprocess: a fresh embedded Ray
with simulated nodes) and is read from its own outputs (``summary.json``, ``metrics.jsonl``):
- time to warm-up + 0.25 held-out accuracy (training time, from the first batch), and the curve;
- generated tokens/s, the engines' own clock, against ``generate`` in one process;
- the weight-sync pause as a fraction of an update (pause → swap into the engine's parameters →
  verify → resume, over the actor's update time);
- colocated: the switch time between actor and engines.

Goals (issue 15, 2 cores): both layouts reach warm-up + 0.25 within 10 minutes of training;
throughput >= 0.7x the one-process figure; pause <= 5 %. On a CPU the colocated pair's sleep moves
nothing (the "device" is the process's memory and the engine's weights stay in it), so the
resident-memory figure of time-sharing is ``benchmarks/timesharing.py``'s, with components that
really release memory. The last line printed is one JSON object with every figure.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import harness
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the job lives in examples/, which is not an installed package

from benchmarks.bundled_job import run_bundled  # noqa: E402
from examples.grpo_lm.lm.config import GRPOConfig  # noqa: E402
from examples.grpo_lm.lm.engine import GenerationEngine  # noqa: E402
from examples.grpo_lm.lm.model import load_pretrained  # noqa: E402
from examples.grpo_lm.lm.task import PromptSampler  # noqa: E402
from examples.grpo_lm.lm.train_local import train  # noqa: E402
from examples.grpo_lm.lm.warmup import warm_start  # noqa: E402
from rlinfra.config.loading import load_config  # noqa: E402
from rlinfra.driver.metrics import read_metrics  # noqa: E402


def job_config(path: Path) -> dict[str, Any]:
    """The ``algo`` section of a bundled config, as plain values."""
    from omegaconf import OmegaConf

    return dict(OmegaConf.to_container(load_config(path)["algo"]))  # type: ignore[arg-type]


LAYOUTS = ("disaggregated", "colocated")
GOAL_S = 600.0
THROUGHPUT_GOAL, PAUSE_GOAL = 0.7, 0.05
# --smoke: the first layout only, two updates from a tiny warm-up made in the run's own folder.
SMOKE = {
    "updates": 2,
    "eval_size": 20,
    "warmup_max_steps": 20,
    "warmup_eval_every": 10,
    "warmup_eval_size": 20,
    "warmup_target_accuracy": 0.2,
}


def settings(smoke: bool, folder: Path) -> dict[str, Any]:
    """The ``algo`` settings a run changes from the bundled config's: none, or the smoke's."""
    return {**SMOKE, "cache_dir": str(folder / "cache")} if smoke else {}


def local_config(layout: str, seed: int, algo: dict[str, Any]) -> GRPOConfig:
    """The one-process GRPO with a bundled config's algo settings (kl_coef, updates: the lr
    decay's length) and ``algo`` over them, stopping at the target."""
    bundled = job_config(ROOT / "examples" / "grpo_lm" / f"{layout}.yaml")
    overrides = {k: v for k, v in {**bundled, **algo}.items() if k in GRPOConfig.model_fields}
    return GRPOConfig(**{**overrides, "seed": seed, "stop_at_target": True})


def run_local(config: GRPOConfig) -> dict[str, Any]:
    result = train(config, log=lambda _: None)
    return {
        "reached": result.reached,
        "warm_accuracy": result.start_accuracy,
        "accuracy": result.final_accuracy,
        "time_to_target_s": None if result.seconds_to_target is None else round(result.seconds_to_target, 2),
        "updates": result.updates,
        "curve": [(u, round(a, 3), round(t, 1)) for u, a, t in result.curve],
    }


def generate_baseline(config: GRPOConfig, prompts_per_call: int, repeats: int = 20) -> dict[str, float]:
    """Completion tokens/s of one process generating ``prompts_per_call`` x G completions: HF
    ``generate`` and the job's own engine (the same model, sampling at the job's temperature,
    with a KV cache)."""
    torch.set_num_threads(config.num_threads)
    model, tokenizer = load_pretrained(warm_start(config.cache_dir, config, log=lambda _: None))
    model.eval()
    engine = GenerationEngine(model, tokenizer)
    sampler = PromptSampler("benchmark")
    figures = {}
    for name in ("hf_generate", "engine"):
        tokens, seconds = 0, 0.0
        for _ in range(repeats):
            prompts = sampler.sample(prompts_per_call)
            started = time.perf_counter()
            if name == "engine":
                out = engine.generate(prompts, config.group_size, config.max_new_tokens, config.temperature)
                tokens += sum(len(c.completion_ids) for c in out)
            else:
                tokens += _hf_generate(model, tokenizer, prompts, config)
            seconds += time.perf_counter() - started
        figures[f"{name}_tokens_per_s"] = round(tokens / seconds, 1)
    return figures


def _hf_generate(model, tokenizer, prompts: list[str], config: GRPOConfig) -> int:
    """Completion tokens HF ``generate`` makes for ``prompts`` x G (left-padded, up to EOS)."""
    batch = [p for p in prompts for _ in range(config.group_size)]
    tokenizer.padding_side = "left"
    encoded = tokenizer(batch, return_tensors="pt", padding=True)
    with torch.no_grad():
        out = model.generate(
            **encoded,
            do_sample=True,
            temperature=config.temperature,
            top_k=0,
            max_new_tokens=config.max_new_tokens,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
        )
    new = out[:, encoded["input_ids"].shape[1] :]
    finished = new == tokenizer.eos_token_id
    lengths = torch.where(
        finished.any(1), finished.int().argmax(1) + 1, torch.full_like(new[:, 0], new.shape[1])
    )
    return int(lengths.sum())


def run_layout(name: str, seed: int, folder: Path, algo: dict[str, Any]) -> dict[str, Any]:
    overrides = tuple(f"algo.{key}={value}" for key, value in algo.items())
    output, wall = run_bundled("grpo_lm", name, seed, folder, timeout_s=GOAL_S * 3, overrides=overrides)
    summary = json.loads((output / "summary.json").read_text())
    records = read_metrics(output)[1:]  # the first iteration commits nothing
    pauses = [r["pause_s"] / r["train_s"] for r in records if r["train_s"] > 0]
    return {
        "reached": summary["time_to_target_s"] is not None,
        "warm_accuracy": summary["warm_accuracy"],
        "accuracy": summary["accuracy"],
        "time_to_target_s": summary["time_to_target_s"],
        "wall_s": round(wall, 1),
        "updates": summary["iterations"],
        "tokens_per_s": statistics.median(r["tokens_per_s"] for r in records),
        "pause_ms": round(1e3 * statistics.median(r["pause_s"] for r in records), 2),
        "update_ms": round(1e3 * statistics.median(r["train_s"] for r in records), 1),
        "pause_fraction": round(statistics.median(pauses), 4),
        "switch_p50_s": summary["switches"].get("total_p50_s"),
        "curve": [(p["iteration"], round(p["accuracy"], 3), p["time_s"]) for p in summary["curve"]],
    }


def main() -> None:
    parser = harness.parser(__doc__)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    layouts = LAYOUTS[:1] if args.smoke else LAYOUTS
    with tempfile.TemporaryDirectory() as folder:
        algo = settings(args.smoke, Path(folder))
        config = local_config("disaggregated", args.seed, algo)
        rows: dict[str, dict[str, Any]] = {"local": run_local(config)}
        for name in layouts:
            rows[name] = run_layout(name, args.seed, Path(folder), algo)
        # one step's whole batch
        generation = generate_baseline(config, config.prompts_per_step, repeats=1 if args.smoke else 20)
    header = ("layout", "reached", "warm", "final", "to target", "updates", "tok/s", "pause")
    print(f"{header[0]:<14}" + "".join(f"{h:>10}" for h in header[1:]))
    for name, row in rows.items():
        ttt = row["time_to_target_s"]
        if name != "local":
            alone = generation["hf_generate_tokens_per_s"]
            row["throughput_vs_generate"] = round(row["tokens_per_s"] / alone, 3)
        cells = (
            row["reached"],
            f"{row['warm_accuracy']:.3f}",
            f"{row['accuracy']:.3f}",
            f"{ttt:.1f}s" if ttt is not None else "-",
            row["updates"],
            row.get("tokens_per_s", "-"),
            row.get("pause_fraction", "-"),
        )
        print(f"{name:<14}" + "".join(f"{cell!s:>10}" for cell in cells))
    print(f"one process generating one step's batch: {generation}")
    goals = {
        name: {
            "reached_within_10_min": bool(rows[name]["reached"]) and rows[name]["time_to_target_s"] <= GOAL_S,
            "throughput": rows[name]["throughput_vs_generate"] >= THROUGHPUT_GOAL,
            "pause": rows[name]["pause_fraction"] <= PAUSE_GOAL,
        }
        for name in layouts
    }
    harness.emit({"benchmark": "grpo_lm", "rows": rows, "generation": generation, "goals": goals}, args.smoke)


if __name__ == "__main__":
    main()
