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

or in Python, ``GRPOJob.run(cfg)`` with ``rlinfra.driver.Run``'s options.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from rich.console import Console

from examples.grpo_lm.config import JobConfig, check_job_config
from examples.grpo_lm.lm.model import ModelLoadError
from examples.grpo_lm.lm.rollout import sample_seed
from examples.grpo_lm.lm.task import PromptSampler, heldout_prompts
from examples.grpo_lm.lm.warmup import start_checkpoint
from examples.grpo_lm.reward import RewardWorker
from examples.grpo_lm.workers import Policy, RolloutWorker
from rlinfra.driver import Batch, Job, JobConfigError, Run, RunResult, RunState, read_metrics
from rlinfra.engines.vllm import VLLMSettings, VLLMSettingsError


@dataclass
class GRPOState(RunState):
    CHECKPOINTED: ClassVar = (*RunState.CHECKPOINTED, "warm_accuracy")
    KEPT_ON_REWIND: ClassVar = (*RunState.KEPT_ON_REWIND, "warm_accuracy")

    warm_accuracy: float | None = None  # held-out accuracy of the start checkpoint (iteration 0)


class GRPOJob(Job):
    title, components, unit, target_key, Config = (
        "GRPO",
        ("actor", "rollout", "reward"),
        "update",
        "accuracy",
        JobConfig,
    )
    usage_errors = (ModelLoadError, VLLMSettingsError)

    def __init__(self, cfg: Mapping[str, Any]) -> None:
        super().__init__(cfg)
        self.job, self.algo = check_job_config(self.config, cfg), self.config.algo
        self.state, self.stop_at_target = GRPOState(), self.algo.stop_at_target
        self.heldout = heldout_prompts(self.algo.eval_size)

    def prepare(self, console: Console) -> None:
        """The start checkpoint (made once by a warm-up, then cached); a model vLLM cannot serve
        faithfully is refused here, before Ray starts."""
        with console.status(
            "the start checkpoint (a warm-up runs once, then is cached under algo.cache_dir)"
        ):
            self.start_path = start_checkpoint(
                self.job.model.path, self.algo.cache_dir, self.algo, console.print
            )
        if self.job.engine.name == "vllm":
            VLLMSettings(model=self.start_path, **self.job.engine.vllm_settings()).check()

    def target(self) -> float | None:
        """Held-out exact match: the start checkpoint's, plus ``algo.target_gain``."""
        warm = self.state.warm_accuracy
        return None if warm is None else warm + self.algo.target_gain

    def curve(self, records: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The start checkpoint's held-out accuracy (iteration 0), then every evaluation's."""
        warm = {"iteration": 0, "time_s": 0.0, "accuracy": self.state.warm_accuracy}
        return [{key: r[key] for key in warm} for r in [warm, *records] if r.get("accuracy") is not None]

    def check(self, run: Run) -> None:
        self.per_engine = run.per_rank(self.algo.prompts_per_step, "rollout", "algo.prompts_per_step")
        colocated = run.relation("actor", "rollout") == "colocated"
        if self.job.engine.name == "vllm" and colocated and run.cluster.config.simulate is not None:
            raise JobConfigError(
                "engine.name: vllm with actor and rollout colocated needs vLLM's sleep mode, which vLLM "
                "has on GPUs only; this cluster simulates its GPUs on a CPU machine (cluster.simulate): "
                "use a disaggregated layout (examples/grpo_lm/vllm.yaml), or engine.name: hf"
            )

    def loop(self, run: Run) -> None:
        algo, path, state, overlap = self.algo, self.start_path, self.state, self.algo.max_staleness >= 1
        self.reward = run.launch("reward", RewardWorker.create_group(algo.format_credit))
        policy = run.start_trainer(lambda: Policy.create_group(actor=(algo, path), ref=(algo, path)))
        self.rollout = run.launch("rollout", self._engines(), max_concurrency=2)  # generate + stage
        run.time_share([policy, self.rollout, self.reward], awake="rollout")
        if state.warm_accuracy is None:  # not resumed
            state.warm_accuracy = self._evaluate(run)
        self._probe(run)
        # The prompt stream goes on after the updates done so far (resumed, or restarted).
        self.sampler, self.drawn = PromptSampler(algo.seed), state.iteration * algo.prompts_per_step
        self.sampler.sample(self.drawn)
        completions = run.batches(self.rollout, RolloutWorker.generate, self._prompts)
        for step in run.steps(algo.updates):
            clock = time.perf_counter()
            batches = completions.gather()
            generate_s = time.perf_counter() - clock
            if overlap:
                run.commit()  # and the engines' log-probs of the probe checked against the trainer's
                if not step.last:
                    completions.issue()  # on the newest weights, while the actor trains
            switch_s, clock = run.wake("actor"), time.perf_counter()
            fresh = step.drop_stale(batches, algo.max_staleness)
            rewards = run.supervised(lambda fresh=fresh: self._score(fresh))  # split among them
            step.train(policy.role("actor").update, fresh, rewards)  # and the trainer's probe log-probs
            train_s = time.perf_counter() - clock
            switch_s += run.wake("rollout")  # (colocated: after the checkpoint, while the actor was awake)
            if not overlap:
                run.commit()  # into the engines, before they generate again
            accuracy = self._evaluate(run) if state.iteration % algo.eval_every == 0 or step.last else None
            if not overlap and not step.last:
                completions.issue()
            tokens = sum(b.payload["tokens"] for b in batches)
            engine_s = max(b.payload["seconds"] for b in batches)  # the engines generate side by side
            step.log(
                accuracy=accuracy,
                generate_s=round(generate_s, 4),
                train_s=round(train_s, 4),
                tokens_per_s=round(tokens / max(engine_s, 1e-9), 1),  # the engines' own clock
                pause_fraction=run.sync_s["pause_s"] / max(train_s, 1e-9),
                switch_s=switch_s,
                reward_mean=round(sum(rewards) / len(rewards), 4) if rewards else None,
            )

    def _engines(self) -> Any:
        if self.job.engine.name == "vllm":
            from examples.grpo_lm.vllm_rollout import VLLMRolloutWorker

            return VLLMRolloutWorker.create_group(self.algo, self.start_path, self.job.engine.vllm_settings())
        return RolloutWorker.create_group(self.algo, self.start_path)

    def _probe(self, run: Run) -> None:
        """The probe: a fixed batch, as engine 0 samples it now (real engine output)."""
        prompts, group = self.heldout[: self.job.engine.probe_size], self.algo.group_size
        made = run.supervised(
            lambda: self.rollout.execute_on(0).generate("probe", prompts, self.algo.seed).wait()[0]
        )
        sequences = [(c.prompt_ids, c.completion_ids) for c in made.payload["completions"][::group]]
        run.probe(sequences, self.job.engine.probe_tolerance)

    def _prompts(self, rank: int) -> tuple[list[str], int]:
        """Each engine's next prompts, and the seed it samples them with."""
        self.drawn += self.per_engine
        return self.sampler.sample(self.per_engine), sample_seed(self.algo.seed, self.drawn * 1_000 + rank)

    def _score(self, batches: list[Batch]) -> list[float]:
        completions = [c for batch in batches for c in batch.payload["completions"]]
        return list(self.reward.score.split(completions).wait()) if completions else []

    def _evaluate(self, run: Run) -> float:
        """Greedy held-out exact match on engine 0, at the version it serves."""
        return float(run.supervised(lambda: self.rollout.execute_on(0).evaluate(self.heldout).wait()[0])[1])

    def line(self, record: dict[str, Any]) -> str:
        accuracy = "" if record["accuracy"] is None else f" | held-out {record['accuracy']:.3f}"
        return (
            f"update {record['iteration']:4d} | reward {record.get('reward_mean') or 0:.3f}{accuracy} | "
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
