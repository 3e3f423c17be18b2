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
from rlinfra.placement.memory import EngineMemory, kv_cache
from rlinfra.placement.model_size import ModelShape, read_model_config
from rlinfra.services.weights import WeightSync, WeightSyncError
from tests.engines.parts import CheckedEngine, PerturbedTrainer
from tests.engines.tiny_models import ARCHITECTURES, hf_logprobs, make_checkpoint

KV_CACHE_MIB = 16
MEMORY_PLANNED = ("llama", "qwen2", "qwen3", "mistral")  # the architectures the memory plan counts
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
    def __init__(self, path: str, kv_cache_mib: int = KV_CACHE_MIB) -> None:
        super().__init__(VLLMSettings(model=path, dtype="float32", kv_cache_mib=kv_cache_mib))
        self.set_initial_weights()

    def kv_capacity(self) -> tuple[int, int, int, int]:
        """vLLM's own KV cache: blocks, tokens per block, the tokens it logs, max_model_len."""
        config = self.llm.llm_engine.vllm_config
        cache = config.cache_config
        return (
            cache.num_gpu_blocks,
            cache.block_size,
            cache.kv_cache_size_tokens,
            config.model_config.max_model_len,
        )


def predicted_kv(path: str, kv_cache_mib: int, max_model_len: int):
    """The plan's KV cache for the engine above, on vLLM's CPU backend (blocks of 128 tokens)."""
    settings = EngineMemory(role="engine", dtype="float32", block_size=128, max_model_len=max_model_len)
    return kv_cache(ModelShape.of(read_model_config(path)), settings, tp=1, available=kv_cache_mib * 2**20)


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
        if ARCHITECTURES[name][0] in MEMORY_PLANNED:  # the plan's KV cache is vLLM's, exactly
            blocks, block_size, tokens, max_len = engine.kv_capacity().wait()[0]
            kv = predicted_kv(path, KV_CACHE_MIB, max_len)
            assert (kv.blocks, kv.block_size, kv.tokens) == (blocks, block_size, tokens)
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


def test_a_context_the_kv_cache_cannot_hold_is_refused_by_vllm_where_the_plan_says(
    cluster, placement, tmp_path
):
    path = make_checkpoint("qwen3", tmp_path / "long")
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 2048}))
    kv = predicted_kv(str(path), 1, 2048)
    assert kv.fits_max_len < 2048  # 1 MiB holds 8 blocks of 128 tokens, one of them the null block
    with pytest.raises(WorkerGroupError) as refused:
        Engine.create_group(str(path), kv_cache_mib=1).launch(
            cluster, placement.get_strategy("engine"), name="engine", launch_timeout=180
        )
    assert f"the estimated maximum model length is {kv.fits_max_len}" in str(refused.value)
