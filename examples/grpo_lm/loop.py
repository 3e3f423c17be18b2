"""The GRPO driver loop, top to bottom. One iteration with ``algo.max_staleness: 1`` (disaggregated):

    wait for batch k              G completions per prompt, each stamped with the version v that made it
    commit v+1 if staged          pause → load into the engines' parameters → verify there → resume;
                                  then the log-prob probe: the engines' log-probs of a fixed batch
                                  equal the trainer's under v+1 (``logprob_mismatch``)
    start batch k+1               on the newest weights; runs while the actor trains on batch k
    score batch k                 the reward workers (``node`` group)
    update on batch k             2 DDP ranks, KL against the fused reference; version → v+2
    prepare v+2                   staged in the engines' host memory while batch k+1 is generated
    evaluate (every eval_every)   greedy held-out exact match on engine 0, at the version it serves
                                  (v+1 here; it waits for engine 0's share of batch k+1)

With ``max_staleness: 0`` (colocated: actor and engines share devices) there is no overlap: the
engines generate, then sleep while the actor trains; the next version is staged and committed
into the sleeping engines (weight updates work on host memory), and they wake, are evaluated on
that version when due, and generate the next batch.

Every batch id ends once (``BatchLedger``): trained, dropped (too stale), lost (its engine died:
the prompts are generated again under a new id, after the supervisor replaced the engine) or
rolled back (a trainer rank died: the trainer is restarted from the last checkpoint, the driver
rewound to it, and the updates since are redone on the same prompts).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from examples.grpo_lm.config import JobConfig
from examples.grpo_lm.launch import Components
from examples.grpo_lm.lm.rollout import sample_seed
from examples.grpo_lm.lm.task import PromptSampler, heldout_prompts
from examples.grpo_lm.reward import RewardWorker
from examples.grpo_lm.workers import RolloutWorker
from rlinfra.runtime.calls import GroupCall
from rlinfra.runtime.errors import WorkerGroupError
from rlinfra.runtime.supervision import Restart
from rlinfra.services.batches import BatchLedger
from rlinfra.services.metrics import MetricsLog
from rlinfra.services.recovery import SupervisedSteps, TrainerRestarter
from rlinfra.services.supervisor import Recovery, UnsupervisedLoss
from rlinfra.services.weights import WeightSync
from rlinfra.services.weights.probe import LogprobProbe

CHECKPOINTED = ("iteration", "training_s", "tokens", "generate_s", "curve", "warm_accuracy", "sampler_draws")
REWOUND = ("iteration", "tokens", "generate_s", "curve", "sampler_draws")  # training_s counts on


@dataclass
class DriverState:
    """What the driver carries across iterations; ``CHECKPOINTED`` also across a resume."""

    iteration: int = 0
    training_s: float = 0.0  # from the first batch to the last update, across resumes
    tokens: int = 0  # completion tokens generated (for tokens/s)
    generate_s: float = 0.0  # engine time spent generating (summed over engines' calls)
    curve: list[tuple[int, float, float]] = field(default_factory=list)  # (iteration, time_s, accuracy)
    warm_accuracy: float | None = None  # held-out accuracy of the start checkpoint
    sampler_draws: int = 0  # prompts drawn so far (a resumed run continues the same stream)
    served_versions: list[int] = field(default_factory=list)
    batch_versions: list[list[int]] = field(default_factory=list)  # per iteration, per engine
    dropped_batches: int = 0
    ledger: BatchLedger = field(default_factory=BatchLedger)
    recoveries: list[Recovery] = field(default_factory=list)  # dead engines / reward workers replaced
    trainer_restarts: list[Restart] = field(default_factory=list)  # the trainer, from its checkpoint

    @classmethod
    def restore(cls, saved: dict[str, Any] | None) -> DriverState:
        saved = dict(saved or {})
        saved["curve"] = [tuple(point) for point in saved.get("curve", [])]
        return cls(**saved)

    def rewind(self, saved: dict[str, Any] | None) -> None:
        """Back to the checkpoint ``checkpointed()`` saved (or to the start) after a trainer
        restart; ``training_s`` keeps counting the time actually spent, the warm-up point stays."""
        start = DriverState.restore(saved)
        for name in REWOUND:
            setattr(self, name, getattr(start, name))
        if not self.curve and self.warm_accuracy is not None:
            self.curve = [(0, 0.0, self.warm_accuracy)]
        del self.batch_versions[self.iteration :]

    def checkpointed(self) -> dict[str, Any]:
        """The fields a resumed run continues from, as plain values (copies: the state goes on)."""
        saved = {name: getattr(self, name) for name in CHECKPOINTED}
        saved["curve"] = list(self.curve)
        return saved

    @property
    def accuracy(self) -> float | None:
        return self.curve[-1][2] if self.curve else None


class TrainingLoop:
    """Batches in, one GRPO update per iteration, new weights out; yields each iteration's record."""

    def __init__(
        self,
        live: Components,
        sync: WeightSync,
        job: JobConfig,
        state: DriverState,
        log: MetricsLog,
        save_checkpoint: Callable[[bytes, dict[str, Any]], None],
        resumed_from: tuple[bytes, dict[str, Any]] | None = None,
    ) -> None:
        """``resumed_from``: the checkpoint a resumed run started from (the actor's bytes and the
        driver's state), which a trainer restart before the next checkpoint goes back to."""
        self.live, self.sync, self.job, self.state, self.log = live, sync, job, state, log
        self.algo = job.algo
        self.save_checkpoint = save_checkpoint
        self.checkpoint = resumed_from  # the last one saved
        self.overlap = self.algo.max_staleness >= 1
        self.sampler = self._prompt_stream(state.sampler_draws)
        self.heldout = heldout_prompts(self.algo.eval_size)
        self.staged_version: int | None = None
        self.drawn_before_batch = state.sampler_draws  # the prompt stream before the batch in flight
        self.generating: dict[int, str] = {}  # engine rank -> id of the batch it is making
        self.prompts: dict[int, list[str]] = {}  # engine rank -> its prompts of the batch in flight
        self.pending: GroupCall | None = None
        self.sync_s = {"prepare_s": 0.0, "pause_s": 0.0, "held_s": 0.0}
        self.probe: LogprobProbe | None = None  # made from engine 0's first samples (iterations)
        self.mismatch: float | None = None  # the last committed version's logprob_mismatch
        assert live.supervisor and live.trainer_budget and live.start_trainer, "the job is not launched"
        self.steps = SupervisedSteps(live.supervisor, state.recoveries, after_heal=self._back_to_schedule)
        self.restarter = TrainerRestarter(
            live.trainer_budget, live.start_trainer, sync, self.steps, state.trainer_restarts
        )
        state.served_versions.append(sync.version)

    @property
    def learner_version(self) -> int:
        return self.staged_version if self.staged_version is not None else self.sync.version

    @property
    def target(self) -> float | None:
        warm = self.state.warm_accuracy
        return None if warm is None else warm + self.algo.target_gain

    def iterations(self) -> Iterator[dict[str, Any]]:
        state = self.state
        if state.warm_accuracy is None:
            _, accuracy = self._evaluate()
            state.warm_accuracy = accuracy
            state.curve.append((0, 0.0, accuracy))
        self.probe = self._make_probe()
        self.clock = time.perf_counter()
        self.pending = self._start_generate()
        while state.iteration < self.algo.updates:
            try:
                record = self._iteration()
            except UnsupervisedLoss as loss:  # a trainer rank: the whole group, from the checkpoint
                self._restart_trainer(loss)
                continue
            yield record
            if self.algo.stop_at_target and record.get("accuracy") is not None and self._reached():
                return

    def _restart_trainer(self, loss: UnsupervisedLoss) -> None:
        """Bring the trainer back from the last checkpoint (or from the start checkpoint before
        the first), serving its weights above the last version; rewind the driver, its metrics,
        its ledger and its prompt stream to that checkpoint, so the updates since are redone on
        the same prompts (none repeated in the record, none skipped); generate again. The
        engines and reward workers are not touched."""
        state = self.state
        if self.pending is not None:  # made with the lost trainer's weights: not trained on
            with contextlib.suppress(WorkerGroupError):
                self.pending.wait()
            self.pending = None
        actor_bytes, saved = self.checkpoint if self.checkpoint is not None else (None, None)
        back_to = int(saved["iteration"]) if saved is not None else 0
        detail = f"from the checkpoint of update {back_to}" if saved else "from the start checkpoint"
        self.live.policy, _ = self.restarter.restart(self.live.policy, loss, actor_bytes, detail)
        state.served_versions.append(self.sync.version)
        state.ledger.dropped(state.ledger.open_ids)  # made with the lost trainer's weights
        state.ledger.rolled_back(after_iteration=back_to)
        state.rewind(saved)
        self.sampler = self._prompt_stream(state.sampler_draws)
        self.log.rewind(back_to)
        self.staged_version = None
        self._turn("rollout")  # colocated: the restarted actor came back asleep
        self.pending = self._start_generate()

    def _prompt_stream(self, drawn: int) -> PromptSampler:
        """The job's prompt stream, after its first ``drawn`` prompts (a resumed or rewound run
        goes on with the same prompts)."""
        sampler = PromptSampler(self.algo.seed)
        sampler.sample(drawn)
        return sampler

    def _reached(self) -> bool:
        target, accuracy = self.target, self.state.accuracy
        return target is not None and accuracy is not None and accuracy >= target

    def _iteration(self) -> dict[str, Any]:
        state, algo = self.state, self.algo
        batches, generate_s = _timed(self._finish_generate, self.pending)
        self.pending = None
        self._commit_staged()
        evaluated = (state.iteration + 1) % algo.eval_every == 0 or state.iteration + 1 == algo.updates
        more = state.iteration + 1 < algo.updates
        if self.overlap and more:
            self.pending = self._start_generate()  # on the newest weights, while the actor trains
        switch_s = self._turn("actor")
        learned, train_s = _timed(self._learn, batches)
        state.iteration += 1
        self._checkpoint_if_due()  # while the actor is awake (colocated: before the engines' turn)
        switch_s += self._turn("rollout")
        if not self.overlap:
            self._commit_staged()  # into the engines, before they generate again
        accuracy = self._evaluate()[1] if evaluated else None
        now = time.perf_counter()
        state.training_s += now - self.clock
        self.clock = now
        if accuracy is not None:
            state.curve.append((state.iteration, round(state.training_s, 3), accuracy))
        if not self.overlap and more:
            self.pending = self._start_generate()
        record = self._record(learned, accuracy, generate_s, train_s, switch_s, batches)
        self.log.write(record)
        return record

    # ------------------------------------------------------------------------- generation
    def _start_generate(self, ranks: list[int] | None = None) -> GroupCall:
        """Every engine (or ``ranks``, again) generates for its share of the prompts, under a new id."""
        rollout, per_engine = self.live.rollout, self.algo.prompts_per_step // len(self.live.rollout.ranks)
        chosen = rollout.ranks if ranks is None else ranks
        if ranks is None:
            self.drawn_before_batch = self.state.sampler_draws
        for rank in chosen:
            if ranks is None:  # a fresh batch; a retry keeps the prompts it had
                self.prompts[rank] = self.sampler.sample(per_engine)
                self.state.sampler_draws += per_engine
            self.generating[rank] = self.state.ledger.issue(f"rollout:{rank}")
        seeds = [sample_seed(self.algo.seed, self.state.sampler_draws * 1_000 + rank) for rank in chosen]
        return rollout.call(
            RolloutWorker.generate,
            chosen,
            per_rank=[(self.prompts[r], s) for r, s in zip(chosen, seeds, strict=True)],
        )

    def _finish_generate(self, pending: GroupCall) -> dict[int, dict[str, Any]]:
        """Every engine's batch. One cut short by a dead engine is lost: the engine is replaced
        (and admitted at the served version) and its prompts generated again under a new id
        (``SupervisedSteps.gathered``)."""
        done: dict[int, dict[str, Any]] = self.steps.gathered(
            pending,
            lost=lambda ranks: self.state.ledger.lost(self.generating[rank] for rank in ranks),
            remake=self._start_generate,
        )
        for rank, batch in done.items():
            batch["batch_id"] = self.generating[rank]
        return dict(sorted(done.items()))

    def _make_probe(self) -> LogprobProbe:
        """A fixed probe batch: one sample each for the first ``probe_size`` held-out prompts, as
        engine 0 makes them now (real engine output: prompt and completion token ids)."""
        size, group = self.job.engine.probe_size, self.algo.group_size
        prompts = self.heldout[:size]
        made = self.steps.retried(
            lambda: self.live.rollout.execute_on(0).generate(prompts, self.algo.seed).wait()[0]
        )
        sequences = [(c.prompt_ids, c.completion_ids) for c in made["completions"][::group]]
        return LogprobProbe(sequences, self.job.engine.probe_tolerance)

    def _evaluate(self) -> tuple[int, float]:
        """Greedy held-out exact match on engine 0, at the version it serves."""
        return self.steps.retried(lambda: self.live.rollout.execute_on(0).evaluate(self.heldout).wait()[0])

    # ----------------------------------------------------------------------------- training
    def _learn(self, batches: dict[int, dict[str, Any]]) -> dict[str, Any]:
        """Drop batches older than ``max_staleness``, score the rest, update, stage the new version."""
        state, learner = self.state, self.learner_version
        for rank, batch in batches.items():  # the engine stamps every sequence; one version per batch
            stamped = {completion.weight_version for completion in batch["completions"]}
            if stamped != {batch["version"]}:
                raise RuntimeError(
                    f"rollout:{rank} returned sequences of versions {sorted(stamped)} in one batch"
                )
        versions = [batch["version"] for batch in batches.values()]
        state.batch_versions.append(versions)
        fresh = [b for b in batches.values() if learner - b["version"] <= self.algo.max_staleness]
        stale = [b for b in batches.values() if learner - b["version"] > self.algo.max_staleness]
        state.ledger.dropped(b["batch_id"] for b in stale)
        state.dropped_batches += len(stale)
        learned: dict[str, Any] = {"batch_version": min(versions), "staleness": learner - min(versions)}
        if not fresh:
            return learned
        completions = [c for batch in fresh for c in batch["completions"]]
        rewards = self._score(completions)
        metrics = self.steps.on_trainer(
            lambda: self.live.policy.role("actor").update(completions, rewards).wait()[0]
        )
        state.ledger.trained([b["batch_id"] for b in fresh], iteration=state.iteration + 1)
        state.tokens += sum(b["tokens"] for b in fresh)
        self._stage(int(metrics.pop("weight_version")))
        learned["reward_mean"] = round(sum(rewards) / len(rewards), 4)
        return learned | {key: round(value, 5) for key, value in metrics.items()}

    def _score(self, completions: list[Any]) -> list[float]:
        """The reward workers score the completions, split evenly among them."""
        reward = self.live.reward

        def score() -> list[float]:
            ranks = reward.ranks
            shares = [completions[i :: len(ranks)] for i in range(len(ranks))]
            scored = reward.call(RewardWorker.score, ranks, per_rank=[(share,) for share in shares]).wait()
            rewards = [0.0] * len(completions)
            for i, values in enumerate(scored):
                rewards[i :: len(ranks)] = values
            return rewards

        return self.steps.retried(score)

    # ------------------------------------------------------------------------------ weights
    def _stage(self, version: int) -> None:
        self.sync_s["prepare_s"] = self.steps.retried(lambda: self.sync.staged_or_prepare(version)).prepare_s
        self.staged_version = version
        if self.probe is not None:  # the trainer's log-probs of the probe under this version
            policy = self.live.policy
            self.steps.on_trainer(
                lambda: self.probe.expect(version, lambda s: policy.execute_on(0).probe_logprobs(s).wait()[0])
            )

    def _commit_staged(self) -> None:
        version = self.staged_version
        if version is None:
            return
        report = self.steps.retried(lambda: self.sync.commit_version(version))
        self.sync_s["pause_s"], self.sync_s["held_s"] = report.pause_s, report.held_s
        self.state.served_versions.append(self.sync.version)
        self.staged_version = None
        if self.probe is not None:  # what the engines now compute, against the trainer's
            probe, rollout = self.probe, self.live.rollout
            self.mismatch = self.steps.retried(lambda: probe.check(version, rollout))

    def _turn(self, component: str) -> float:
        """Give ``component`` the shared devices (colocated); the switch's seconds, else 0. A
        switch that failed on a dead engine is redone once it is replaced; on a dead actor rank it
        raises ``UnsupervisedLoss`` (the trainer is restarted)."""
        turns = self.live.turns
        if turns is None:
            return 0.0
        switch = self.steps.retried(lambda: turns.wake(component))
        return switch.total_s if switch is not None else 0.0

    def _back_to_schedule(self) -> None:
        """After a recovery (colocated): a replaced engine comes up awake; asleep unless it is the
        engines' turn."""
        turns = self.live.turns
        if turns is not None and turns.state("rollout") != "awake":
            turns.sleep("rollout")

    # ------------------------------------------------------------------------------ records
    def _record(
        self,
        learned: dict[str, Any],
        accuracy: float | None,
        generate_s: float,
        train_s: float,
        switch_s: float,
        batches: dict[int, dict[str, Any]],
    ) -> dict[str, Any]:
        state = self.state
        tokens = sum(b["tokens"] for b in batches.values())
        engine_s = max(b["seconds"] for b in batches.values())  # the engines generate side by side
        pause_s = self.sync_s["pause_s"]
        return {
            "iteration": state.iteration,
            "time_s": round(state.training_s, 3),
            "accuracy": accuracy,
            "learner_version": self.learner_version,
            "served_version": self.sync.version,
            "generate_s": round(generate_s, 4),
            "train_s": round(train_s, 4),
            "tokens_per_s": round(tokens / max(engine_s, 1e-9), 1),  # the engines' own clock
            "prepare_s": round(self.sync_s["prepare_s"], 5),
            "pause_s": round(pause_s, 5),
            "held_s": round(self.sync_s["held_s"], 5),
            "pause_fraction": round(pause_s / max(train_s, 1e-9), 5),
            "switch_s": round(switch_s, 5),
            "logprob_mismatch": self.mismatch,
        } | learned

    def _checkpoint_if_due(self) -> None:
        """Every ``checkpoint_every`` iterations and at the last: the actor's state and the driver's.
        The prompt stream is saved as it was before the batch in flight, which a run going on from
        this checkpoint (resumed, or after a trainer restart) makes again."""
        iteration = self.state.iteration
        if iteration % self.job.run.checkpoint_every == 0 or iteration == self.algo.updates:
            actor_state = self.steps.on_trainer(lambda: self.live.policy.role("actor").checkpoint().wait()[0])
            driver_state = self.state.checkpointed()
            if self.pending is not None:
                driver_state["sampler_draws"] = self.drawn_before_batch
            self.checkpoint = (actor_state, driver_state)
            self.save_checkpoint(*self.checkpoint)


def _timed(call: Callable[..., Any], *args: Any) -> tuple[Any, float]:
    started = time.perf_counter()
    return call(*args), time.perf_counter() - started
