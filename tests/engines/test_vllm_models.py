"""Any causal LM vLLM serves, on one code path: tiny random-init Llama, Qwen2 (also with tied
embeddings), Qwen3, Mistral, Phi3 and Gemma checkpoints (``tiny_models.py``) on the real vLLM.

For each: vLLM loads it (and rlinfra checks every shard against the checkpoint as version 0);
its log-probs equal the Hugging Face trainer's to 1e-4 before and after an update that vLLM's
own loader put in and rlinfra verified; and a wrong load of the next update (a tensor loaded with
1.0 added, inside vLLM's worker) is caught by the shard check and rolled back. One trainer actor
serves every architecture; each gets an engine of its own. An architecture vLLM does not know is
refused when the engine starts, with vLLM's reason.
"""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from rlinfra import WorkerGroupError
from rlinfra.engines.vllm import VLLMSettings
from rlinfra.services.weights import WeightSync, WeightSyncError
from tests.engines.parts import CheckedEngine, PerturbedTrainer
from tests.engines.tiny_models import ARCHITECTURES, hf_logprobs, make_checkpoint

CFG = {"cluster": {"num_nodes": 1, "simulate": "1x2", "component_placement": {"trainer": "0", "engine": "1"}}}
pytestmark = [pytest.mark.timeout(240), pytest.mark.cluster(CFG), pytest.mark.vllm]
EXACT = 1e-4
SEQUENCES = [([1, 4, 5, 13], [6, 7, 14, 2]), ([1, 8, 9, 13, 10], [11, 12, 3])]


class Trainer(PerturbedTrainer):
    """A Hugging Face model of any architecture, loaded by ``load``."""

    def load(self, path: str) -> None:
        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        self.keep_start()

    def logprobs(self, sequences):
        return hf_logprobs(self.model, sequences)


class Engine(CheckedEngine):
    def __init__(self, path: str) -> None:
        super().__init__(VLLMSettings(model=path, dtype="float32", kv_cache_mib=16))
        self.set_initial_weights()


@pytest.fixture(scope="module")
def trainer(cluster, placement):
    group = Trainer.create_group().launch(cluster, placement.get_strategy("trainer"), name="trainer")
    yield group
    group.shutdown()


def _mismatch(trainer, engine) -> float:
    ours = trainer.logprobs(SEQUENCES).wait()[0]
    theirs = engine.engine_logprobs(SEQUENCES).wait()[0]
    return max(abs(a - b) for x, y in zip(ours, theirs, strict=True) for a, b in zip(x, y, strict=True))


@pytest.mark.parametrize("name", list(ARCHITECTURES))
def test_an_architecture_loads_serves_the_trainers_logprobs_and_takes_verified_updates(
    name, trainer, cluster, placement, tmp_path
):
    path = str(make_checkpoint(name, tmp_path / name))
    trainer.load(path).wait()
    engine = Engine.create_group(path).launch(
        cluster, placement.get_strategy("engine"), name="engine", max_concurrency=2, launch_timeout=180
    )
    try:
        assert engine.served().wait() == [("0", [(0, 0, ())])]
        assert _mismatch(trainer, engine) < EXACT
        sync = WeightSync(trainer, engine)
        trainer.train_to(1).wait()
        assert sync.update(1).version == 1
        assert engine.served().wait() == [("1", [(0, 1, ())])]
        assert _mismatch(trainer, engine) < EXACT

        engine.fault("perturb").wait()
        trainer.train_to(2).wait()
        with pytest.raises(WeightSyncError, match=r"1 parameter\(s\) differ from version 2 loaded afresh"):
            sync.update(2)
        assert engine.served().wait() == [("1", [(0, 1, ())])]
        trainer.train_to(1).wait()
        assert _mismatch(trainer, engine) < EXACT  # back on version 1, exactly
    finally:
        engine.shutdown()


def test_an_architecture_vllm_cannot_serve_is_refused_at_start_with_vllms_reason(
    cluster, placement, tmp_path
):
    path = make_checkpoint("llama", tmp_path / "unknown")
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "architectures": ["NoSuchForCausalLM"]}))
    with pytest.raises(WorkerGroupError) as refused:
        Engine.create_group(str(path)).launch(
            cluster, placement.get_strategy("engine"), name="engine", launch_timeout=180
        )
    assert "rank 0" in str(refused.value) and "NoSuchForCausalLM" in str(refused.value)
