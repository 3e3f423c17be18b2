"""A decoder's parameter count from its Hugging Face ``config.json`` alone: the first input of a
memory plan, for a model whose weights the planning machine does not have (a 2 KB file plans a
70B run). Pure arithmetic over the config's fields, checked exactly against
``AutoModelForCausalLM.from_config`` in the tests.

Per layer: attention with grouped KV heads (q and o: ``heads × head_dim``; k and v:
``kv_heads × head_dim``), with the biases the architecture has (Qwen2's q/k/v; ``attention_bias``:
q/k/v/o) and Qwen3's per-head q/k norms; a gated MLP (gate, up, down; ``mlp_bias``), or for a
mixture of experts (Mixtral, Qwen3-MoE) a router and one gated MLP per expert; two norms. Then the
embeddings, the final norm and the output head unless tied.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlinfra.config import ConfigError

ARCHITECTURES = ("llama", "mistral", "qwen2", "qwen3", "mixtral", "qwen3_moe")


def read_model_config(path: str | Path) -> dict[str, Any]:
    """``config.json`` from a checkpoint directory, or the file itself; a ``ConfigError`` saying
    what is missing or unreadable."""
    file = Path(path) / "config.json" if Path(path).is_dir() else Path(path)
    try:
        return dict(json.loads(file.read_text(encoding="utf-8")))
    except (OSError, ValueError) as error:
        raise ConfigError(
            f"{file}: cannot read the model's config ({error})", expected="a Hugging Face config.json"
        ) from None


@dataclass(frozen=True)
class ModelShape:
    """What memory depends on, read once from a config: the parameter count and a layer's sizes
    (``kv_heads`` grouped KV heads of ``head_dim``; ``intermediate`` the MLP's width, one expert's
    for a mixture of experts), the vocabulary, the longest context and the stored dtype."""

    parameters: int
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    max_positions: int
    dtype: str

    @classmethod
    def of(cls, config: Mapping[str, Any]) -> ModelShape:
        """The shape of the model ``config`` describes; a ``ConfigError`` for an architecture
        this module cannot count."""
        kind = config.get("model_type")
        if kind not in ARCHITECTURES:
            raise ConfigError(
                f"model_type {kind!r}: no parameter count for this architecture",
                expected="one of " + ", ".join(repr(name) for name in ARCHITECTURES),
            )
        hidden, layers, vocab = (
            int(config[key]) for key in ("hidden_size", "num_hidden_layers", "vocab_size")
        )
        heads = int(config["num_attention_heads"])
        kv_heads = int(config.get("num_key_value_heads") or heads)
        head_dim = int(config.get("head_dim") or hidden // heads)
        q, kv = heads * head_dim, kv_heads * head_dim
        attention = 2 * hidden * q + 2 * hidden * kv
        if config.get("attention_bias"):
            attention += q + 2 * kv + hidden
        elif kind == "qwen2":
            attention += q + 2 * kv
        if kind in ("qwen3", "qwen3_moe"):
            attention += 2 * head_dim
        experts = int(config.get("num_local_experts") or config.get("num_experts") or 0)
        width = int((experts and config.get("moe_intermediate_size")) or config["intermediate_size"])
        if experts:
            mlp = experts * 3 * hidden * width + hidden * experts
        else:
            mlp = 3 * hidden * width + (2 * width + hidden if config.get("mlp_bias") else 0)
        head = 0 if config.get("tie_word_embeddings") else vocab * hidden
        return cls(
            parameters=vocab * hidden + layers * (attention + mlp + 2 * hidden) + hidden + head,
            layers=layers,
            hidden=hidden,
            heads=heads,
            kv_heads=kv_heads,
            head_dim=head_dim,
            intermediate=width,
            vocab=vocab,
            max_positions=int(config.get("max_position_embeddings") or 2048),
            dtype=str(config.get("torch_dtype") or config.get("dtype") or "float32"),
        )


def parameter_count(config: Mapping[str, Any]) -> int:
    """Every parameter of the model ``config`` describes (shared embeddings counted once)."""
    return ModelShape.of(config).parameters
