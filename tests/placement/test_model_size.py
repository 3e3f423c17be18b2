"""A model's parameter count from its config.json alone equals what Hugging Face builds from the
same config: dense (Llama, Mistral, Qwen2 with its q/k/v biases, Qwen3 with its q/k norms),
tied or not, with grouped KV heads and an explicit head_dim, and mixtures of experts."""

from __future__ import annotations

import json

import pytest

from rlinfra.config import ConfigError
from rlinfra.placement.model_size import parameter_count, read_model_config

transformers = pytest.importorskip("transformers")  # the grpo extra; make test installs it

TINY = {
    "vocab_size": 101,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}
CASES = {
    "llama": {},
    "llama, tied, biased": {"tie_word_embeddings": True, "attention_bias": True, "mlp_bias": True},
    "mistral": {},
    "qwen2": {},
    "qwen2, tied": {"tie_word_embeddings": True},
    "qwen3": {"head_dim": 32},
    "qwen3, tied, MHA": {"tie_word_embeddings": True, "num_key_value_heads": 4},
    "mixtral": {"num_local_experts": 4, "num_experts_per_tok": 2},
    "qwen3_moe": {
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 48,
        "decoder_sparse_step": 1,
    },
}


@pytest.mark.parametrize("case", CASES)
def test_the_count_from_config_equals_the_built_model(case: str) -> None:
    kind = case.split(",")[0]
    config = transformers.AutoConfig.for_model(kind, **(TINY | CASES[case]))
    model = transformers.AutoModelForCausalLM.from_config(config)
    assert parameter_count(config.to_dict()) == sum(p.numel() for p in model.parameters())


def test_a_config_json_is_read_from_its_checkpoint_directory(tmp_path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", **TINY}))
    assert read_model_config(tmp_path)["hidden_size"] == 64
    with pytest.raises(ConfigError, match=r"cannot read the model's config"):
        read_model_config(tmp_path / "missing")


def test_an_architecture_without_a_count_is_refused_naming_those_with_one() -> None:
    with pytest.raises(ConfigError, match=r"model_type 'gpt2': no parameter count") as refused:
        parameter_count({"model_type": "gpt2", **TINY})
    assert "'llama'" in str(refused.value) and "'qwen3_moe'" in str(refused.value)


def test_a_published_model_counts_as_its_checkpoint_holds() -> None:
    """Qwen2.5-7B's published config.json fields. Its safetensors index holds 15,231,233,024 bytes
    of bf16 weights, 2 bytes × 7,615,616,512 (the model card's "7.61B")."""
    qwen25_7b = {
        "model_type": "qwen2",
        "vocab_size": 152064,
        "hidden_size": 3584,
        "intermediate_size": 18944,
        "num_hidden_layers": 28,
        "num_attention_heads": 28,
        "num_key_value_heads": 4,
        "tie_word_embeddings": False,
    }
    assert parameter_count(qwen25_7b) == 7_615_616_512
