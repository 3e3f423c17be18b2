"""The second main job: GRPO on a small Hugging Face transformer, on ``rlinfra.driver``.

One iteration with ``algo.max_staleness: 1`` (disaggregated):

    wait for batch k              G completions per prompt, each stamped with the version v that made it
    commit v+1 if staged          pause → load into the engines' parameters → verify → resume; then
                                  the engines' log-probs of a fixed probe batch must equal the
                                  trainer's under v+1 (``logprob_mismatch``)
    start batch k+1               on the newest weights; runs while the actor trains on batch k
    score and update on batch k   the reward workers, then 2 DDP ranks with KL to the fused reference
    prepare v+2                   staged in the engines' host memory while batch k+1 is generated
    evaluate (every eval_every)   greedy held-out exact match on engine 0, at the version it serves

With ``max_staleness: 0`` (colocated: actor and engines share devices and take turns) there is no
overlap. Faults, checkpoints, ``--resume``, metrics, Ctrl-C and the log-prob probe are the driver's.

    rlinfra run examples/grpo_lm/disaggregated.yaml [algo.updates=200 ...] [--resume]
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from rich.console import Console

from examples.grpo_lm.config import JobConfig, parse_job_config
from examples.grpo_lm.lm.model import ModelLoadError
from examples.grpo_lm.lm.rollout import sample_seed
from examples.grpo_lm.lm.task import PromptSampler, heldout_prompts
from examples.grpo_lm.lm.warmup import start_checkpoint
from examples.grpo_lm.reward import RewardWorker
from examples.grpo_lm.workers import Policy, RolloutWorker
from rlinfra.driver import Batch, Job, JobConfigError, Run, RunResult, RunState, job_main, read_metrics
from rlinfra.engines.vllm import VLLMSettings, VLLMSettingsError


@dataclass
class GRPOState(RunState):
    CHECKPOINTED: ClassVar = (*RunState.CHECKPOINTED, "warm_accuracy")
    KEPT_ON_REWIND: ClassVar = (*RunState.KEPT_ON_REWIND, "warm_accuracy")

    warm_accuracy: float | None = None  # held-out accuracy of the start checkpoint (iteration 0)


class GRPOJob(Job):
    title, components, unit, target_key = "GRPO", ("actor", "rollout", "reward"), "update", "accuracy"

    def __init__(self, job: JobConfig, start_path: str) -> None:
        self.job, self.algo, self.settings, self.start_path = job, job.algo, job.run, start_path
        self.total, self.state, self.stop_at_target = job.algo.updates, GRPOState(), job.algo.stop_at_target
        self.overlap = job.algo.max_staleness >= 1
        self.heldout = heldout_prompts(job.algo.eval_size)

    def target(self) -> float | None:
        """Held-out exact match: the start checkpoint's, plus ``algo.target_gain``."""
        warm = self.state.warm_accuracy
        return None if warm is None else warm + self.algo.target_gain

    def curve(self, records: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The start checkpoint's held-out accuracy (iteration 0), then every evaluation's."""
        warm = {"iteration": 0, "time_s": 0.0, "accuracy": self.state.warm_accuracy}
        return [{key: r[key] for key in warm} for r in [warm, *records] if r.get("accuracy") is not None]

    def check(self, run: Run) -> None:
        self.per_engine = run.share(self.algo.prompts_per_step, "rollout", "algo.prompts_per_step")
        colocated = run.relation("actor", "rollout") == "colocated"
        if self.job.engine.name == "vllm" and colocated and run.cluster.config.simulate is not None:
            raise JobConfigError(
                "engine.name: vllm with actor and rollout colocated needs vLLM's sleep mode, which vLLM "
                "has on GPUs only; this cluster simulates its GPUs on a CPU machine (cluster.simulate): "
                "use a disaggregated layout (examples/grpo_lm/vllm.yaml), or engine.name: hf"
            )

    def launch(self, run: Run) -> None:
        algo, path = self.algo, self.start_path
        self.reward = run.launch("reward", RewardWorker.create_group(self.algo.format_credit))
        version = run.start_trainer(lambda: Policy.create_group(actor=(algo, path), ref=(algo, path)))
        if self.job.engine.name == "vllm":
            from examples.grpo_lm.vllm_rollout import VLLMRolloutWorker

            engines = VLLMRolloutWorker.create_group(algo, path, self.job.engine.vllm_settings())
        else:
            engines = RolloutWorker.create_group(algo, path)
        self.rollout = run.launch("rollout", engines, max_concurrency=2)  # generate + stage
        run.connect_weights(self.rollout, version)
        run.supervise([self.rollout, self.reward])
        run.time_share([run.trainer, self.rollout, self.reward], awake="rollout")
        if self.state.warm_accuracy is None:  # not resumed
            self.state.warm_accuracy = self._evaluate(run)
        # The probe: a fixed batch, as engine 0 samples it now (real engine output).
        prompts, group = self.heldout[: self.job.engine.probe_size], self.algo.group_size
        made = run.retried(lambda: self.rollout.execute_on(0).generate(prompts, self.algo.seed).wait()[0])
        sequences = [(c.prompt_ids, c.completion_ids) for c in made["completions"][::group]]
        run.probe(sequences, self.job.engine.probe_tolerance)

    def start(self, run: Run) -> None:
        self.sampler = PromptSampler(self.algo.seed)
        self.drawn = self.state.iteration * self.algo.prompts_per_step  # by the updates done so far
        self.sampler.sample(self.drawn)  # the same prompt stream goes on after them (resumed, restarted)
        self._generate(run)

    def _generate(self, run: Run) -> None:
        prompts = {rank: self.sampler.sample(self.per_engine) for rank in self.rollout.ranks}
        self.drawn += self.per_engine * len(prompts)
        seeds = {rank: sample_seed(self.algo.seed, self.drawn * 1_000 + rank) for rank in prompts}
        self.pending = run.generate(self.rollout, RolloutWorker.generate, lambda r, _: (prompts[r], seeds[r]))

    def _evaluate(self, run: Run) -> float:
        """Greedy held-out exact match on engine 0, at the version it serves."""
        return float(run.retried(lambda: self.rollout.execute_on(0).evaluate(self.heldout).wait()[0])[1])

    def step(self, run: Run) -> dict[str, Any]:
        state, algo, clock = self.state, self.algo, time.perf_counter()
        batches = run.gather(self.pending)
        generate_s = time.perf_counter() - clock
        run.commit()  # and the engines' log-probs of the probe checked against the trainer's
        last = state.iteration + 1 == algo.updates
        if self.overlap and not last:
            self._generate(run)  # on the newest weights, while the actor trains
        switch_s, clock = run.turn("actor"), time.perf_counter()
        learned = self._learn(run, batches)
        train_s = time.perf_counter() - clock
        switch_s += run.turn("rollout")  # (colocated: after the checkpoint, while the actor was awake)
        if not self.overlap:
            run.commit()  # into the engines, before they generate again
        accuracy = self._evaluate(run) if state.iteration % algo.eval_every == 0 or last else None
        if not self.overlap and not last:
            self._generate(run)
        tokens = sum(b.value["tokens"] for b in batches)
        engine_s = max(b.value["seconds"] for b in batches)  # the engines generate side by side
        return {
            "accuracy": accuracy,
            "generate_s": round(generate_s, 4),
            "train_s": round(train_s, 4),
            "tokens_per_s": round(tokens / max(engine_s, 1e-9), 1),  # the engines' own clock
            "pause_fraction": round(run.sync_s["pause_s"] / max(train_s, 1e-9), 5),
            "switch_s": round(switch_s, 5),
        } | learned

    def _learn(self, run: Run, batches: list[Batch]) -> dict[str, Any]:
        """Drop batches older than ``max_staleness``, score the rest, update, stage the new version.
        A batch has one version: both engines generate it within one ``serving()`` block, which
        stamps every sequence with it."""
        fresh = run.fresh(batches, self.algo.max_staleness, lambda b: int(b.value["version"]))
        if not fresh:
            run.updated([])
            return {}
        completions = [c for batch in fresh for c in batch.value["completions"]]
        rewards = run.retried(lambda: self.reward.score.split(completions).wait())  # split among them
        metrics = run.on_trainer(lambda: run.trainer.role("actor").update(completions, rewards).wait()[0])
        run.stage(int(metrics.pop("weight_version")))  # and the trainer's log-probs of the probe under it
        run.updated([b.id for b in fresh])
        learned = {key: round(value, 5) for key, value in metrics.items()}
        return learned | {"reward_mean": round(sum(rewards) / len(rewards), 4)}

    def line(self, record: dict[str, Any]) -> str:
        accuracy = "" if record["accuracy"] is None else f" | held-out {record['accuracy']:.3f}"
        return (
            f"update {record['iteration']:4d} | reward {record.get('reward_mean', 0):.3f}{accuracy} | "
            f"serving v{record['served_version']} | {record['tokens_per_s']:.0f} tok/s"
        )

    def outcome(self, result: RunResult) -> dict[str, Any]:
        """The held-out curve, from the metrics (rewound and resumed with them), and its last point."""
        curve = self.curve(read_metrics(result.output_dir))
        accuracy = curve[-1]["accuracy"] if curve else None
        return {"warm_accuracy": self.state.warm_accuracy, "accuracy": accuracy, "curve": curve}

    def report(self, result: RunResult) -> list[str]:
        accuracies = (self.state.warm_accuracy, self.outcome(result)["accuracy"])
        shown = ["—" if a is None else f"{a:.3f}" for a in accuracies]
        return [f"held-out exact match {shown[0]} (warm-up) → {shown[1]}"]


def run(cfg: Mapping[str, Any], **options: Any) -> RunResult:
    """Make (or load) the start checkpoint, then place, launch and train: ``rlinfra.driver.Run``'s
    options (``resume``, ``cluster``, ``console``, ``on_iteration``)."""
    job, console = parse_job_config(cfg), options.setdefault("console", Console())
    with console.status("the start checkpoint (a warm-up runs once, then is cached under algo.cache_dir)"):
        start_path = start_checkpoint(job.model.path, job.algo.cache_dir, job.algo, console.print)
    if job.engine.name == "vllm":  # a model vLLM cannot serve faithfully is refused before Ray starts
        VLLMSettings(model=start_path, **job.engine.vllm_settings()).check()
    return Run(GRPOJob(job, start_path), cfg, **options).execute()


def main(cfg: Mapping[str, Any], *, resume: bool = False) -> int:
    """What ``rlinfra run`` calls: run, report, the exit status."""
    return job_main(run, cfg, resume=resume, usage_errors=(ModelLoadError, VLLMSettingsError))
