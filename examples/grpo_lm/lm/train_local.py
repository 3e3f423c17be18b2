"""Single-process GRPO on two-number addition: the reference the distributed job must match.

Run from the repository root:  python -m examples.grpo_lm.lm.train_local [--seed 0] [--updates 1500]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from .config import GRPOConfig
from .engine import GenerationEngine
from .learner import Learner
from .model import load_pretrained
from .rollout import collect, evaluate, sample_seed
from .task import PromptSampler, heldout_prompts
from .warmup import warm_start


@dataclass
class TrainResult:
    reached: bool  # held-out accuracy reached start_accuracy + target_gain at some evaluation
    start_accuracy: float  # the warm start's held-out greedy exact match
    final_accuracy: float
    best_accuracy: float
    updates: int
    seconds: float  # the GRPO loop alone (the warm start is cached, and timed separately)
    warm_start_seconds: float
    seconds_to_target: float | None  # first evaluation at or above the target, if any
    curve: list[tuple[int, float, float]] = field(default_factory=list)  # (update, accuracy, seconds)


def train(config: GRPOConfig, log: Callable[[str], None] = print) -> TrainResult:
    """Warm start -> (collect groups, score, one GRPO update) x N, evaluating held-out accuracy as it goes."""
    torch.set_num_threads(config.num_threads)
    torch.manual_seed(config.seed)
    t0 = time.perf_counter()
    path = warm_start(config.cache_dir, config, log)
    warm_seconds = time.perf_counter() - t0
    model, tokenizer = load_pretrained(path)
    # One process: the engine samples from the very module the learner trains, so the weights are always
    # current. Its per-call KV cache means nothing computed with old weights survives an update.
    engine = GenerationEngine(model, tokenizer)
    learner = Learner(model, config)
    sampler = PromptSampler(config.seed)
    heldout = heldout_prompts(config.eval_size)
    start_acc = evaluate(engine, heldout, config.max_new_tokens)
    target = start_acc + config.target_gain
    curve = [(0, start_acc, 0.0)]
    log(f"warm start held-out exact match {start_acc:.3f}; target {target:.3f}")
    start = time.perf_counter()
    to_target: float | None = None
    update = 0
    for update in range(1, config.updates + 1):
        scored = collect(
            engine,
            sampler,
            config.prompts_per_step,
            config.group_size,
            config.max_new_tokens,
            config.temperature,
            sample_seed(config.seed, update),
            config.format_credit,
        )
        metrics = learner.update(scored.completions, scored.rewards)
        engine.weight_version = learner.weight_version
        if update % config.eval_every == 0 or update == config.updates:
            acc = evaluate(engine, heldout, config.max_new_tokens)
            elapsed = time.perf_counter() - start
            curve.append((update, acc, elapsed))
            log(_format(update, elapsed, acc, scored.mean_reward, metrics))
            if to_target is None and acc >= target:
                to_target = elapsed
                if config.stop_at_target:
                    break
    seconds = time.perf_counter() - start
    accs = [a for _, a, _ in curve]
    return TrainResult(
        to_target is not None, start_acc, accs[-1], max(accs), update, seconds, warm_seconds, to_target, curve
    )


def _format(update: int, elapsed: float, acc: float, reward: float, m: dict[str, float]) -> str:
    return (
        f"update {update:5d} | {elapsed:6.1f} s | held-out {acc:.3f} | reward {reward:.3f} | "
        f"kl {m['kl']:.4f} clip {m['clip_frac']:.3f} ratio {m['ratio_mean']:.3f} grad {m['grad_norm']:.3f}"
    )


def parse_config(argv: list[str] | None = None) -> GRPOConfig:
    """Every GRPOConfig field becomes a --flag, so tuning runs need no code edits."""
    parser = argparse.ArgumentParser(description=__doc__)
    for name, default in GRPOConfig().model_dump().items():
        kind = (lambda s: s.lower() in ("1", "true", "yes")) if isinstance(default, bool) else type(default)
        parser.add_argument(f"--{name.replace('_', '-')}", type=kind, default=default)
    return GRPOConfig(**vars(parser.parse_args(argv)))


def main(argv: list[str] | None = None) -> None:
    config = parse_config(argv)
    result = train(config)
    print("curve (update, held-out exact match, seconds):")
    for update, acc, sec in result.curve:
        print(f"  {update:5d}  {acc:.3f}  {sec:6.1f}")
    status = "reached" if result.reached else "did NOT reach"
    when = f" after {result.seconds_to_target:.1f} s" if result.seconds_to_target is not None else ""
    print(
        f"{status} warm start + {config.target_gain:g} ({result.start_accuracy:.3f} -> "
        f"{result.start_accuracy + config.target_gain:.3f}){when} | final {result.final_accuracy:.3f} "
        f"best {result.best_accuracy:.3f} | {result.updates} updates in {result.seconds:.1f} s "
        f"(warm start {result.warm_start_seconds:.1f} s)"
    )


if __name__ == "__main__":
    main()
