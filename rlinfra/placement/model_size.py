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


def parameter_count(config: Mapping[str, Any]) -> int:
    """Every parameter of the model ``config`` describes (shared embeddings counted once)."""
    kind = config.get("model_type")
    if kind not in ARCHITECTURES:
        raise ConfigError(
            f"model_type {kind!r}: no parameter count for this architecture",
            expected="one of " + ", ".join(repr(name) for name in ARCHITECTURES),
        )
    hidden, layers, vocab = (
        int(config["hidden_size"]),
        int(config["num_hidden_layers"]),
        int(config["vocab_size"]),
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
    if experts:
        per_expert = 3 * hidden * int(config.get("moe_intermediate_size") or config["intermediate_size"])
        mlp = experts * per_expert + hidden * experts
    else:
        mlp = 3 * hidden * int(config["intermediate_size"]) + (
            2 * int(config["intermediate_size"]) + hidden if config.get("mlp_bias") else 0
        )
    head = 0 if config.get("tie_word_embeddings") else vocab * hidden
    return vocab * hidden + layers * (attention + mlp + 2 * hidden) + hidden + head
