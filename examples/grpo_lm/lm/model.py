"""The policy: a ~330k-parameter Llama-style causal LM, built locally or loaded from a local checkpoint.

Llama (RMSNorm, rotary positions, SwiGLU) rather than a bespoke net so the job exercises the same code
paths a real Hugging Face policy does: ``LlamaConfig``, ``save_pretrained``/``from_pretrained``, the
KV cache. Checkpoints are safetensors only: loading a pickle can execute code, and a checkpoint
directory is exactly the kind of file that gets copied between machines.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)
from transformers.utils import logging as hf_logging

WEIGHTS_FILE = "model.safetensors"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


class ModelLoadError(RuntimeError):
    """A checkpoint directory is not a usable (causal LM + matching tokenizer) checkpoint."""


@dataclass(frozen=True)
class ModelConfig:
    """Shape of the policy. The defaults give 332,160 parameters with the 15-token vocabulary: big enough
    to learn two-digit addition, small enough that an update costs tens of milliseconds on one core."""

    hidden_size: int = 128
    num_layers: int = 2
    num_heads: int = 4
    intermediate_size: int = 256
    max_positions: int = 32  # prompt (<= 7 tokens) + completion (<= 4): ample headroom
    # "sdpa" and "eager" give the same numbers; for a model this small on CPU, sdpa is not slower.
    attn_implementation: str = "sdpa"


def llama_config(config: ModelConfig, tokenizer: PreTrainedTokenizerBase) -> LlamaConfig:
    if config.hidden_size % config.num_heads:
        raise ValueError(f"hidden_size {config.hidden_size} is not divisible by num_heads {config.num_heads}")
    return LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        num_key_value_heads=config.num_heads,
        head_dim=config.hidden_size // config.num_heads,
        max_position_embeddings=config.max_positions,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=False,
        attention_dropout=0.0,
    )


def build_model(config: ModelConfig, tokenizer: PreTrainedTokenizerBase, seed: int) -> LlamaForCausalLM:
    """A freshly initialised policy. The seed fixes the weights without touching the caller's global
    torch RNG, so building a model mid-run does not shift the run's sampling stream."""
    hf_config = llama_config(config, tokenizer)
    hf_config._attn_implementation = config.attn_implementation
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(hf_config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    return model


def num_parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


@contextmanager
def _quiet_progress() -> Iterator[None]:
    """Saving and loading a 1 MB checkpoint is instant; transformers' per-shard progress bars would only
    bury the training log (restored afterwards: the setting is process-global)."""
    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


def save_checkpoint(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, path: str | Path) -> Path:
    """Model (safetensors) and tokenizer side by side, the layout ``load_pretrained`` expects."""
    out = Path(path)
    kwargs: dict[str, Any] = {}
    if "safe_serialization" in inspect.signature(model.save_pretrained).parameters:
        kwargs["safe_serialization"] = True  # transformers 4.x; 5.x writes safetensors only
    with _quiet_progress():
        model.save_pretrained(out, **kwargs)
        tokenizer.save_pretrained(out)
    if not (out / WEIGHTS_FILE).is_file():
        raise RuntimeError(f"save_pretrained wrote no {WEIGHTS_FILE} into {out}")
    return out


def load_pretrained(path: str | Path) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Model and tokenizer from a local checkpoint directory, checked to belong together.

    Every refusal raises ``ModelLoadError`` naming the path and what was expected there, because the
    alternative failures (a hub lookup for a typo'd path, a silent index error from a vocabulary
    mismatch deep in the first forward) point nowhere near the cause.
    """
    root = Path(path)
    expected = f"a checkpoint directory with config.json, {WEIGHTS_FILE} and tokenizer files"
    if not root.exists():
        raise ModelLoadError(f"checkpoint {root} does not exist; expected {expected}")
    if not root.is_dir():
        raise ModelLoadError(f"checkpoint {root} is not a directory; expected {expected}")
    if not (root / "config.json").is_file():
        raise ModelLoadError(f"checkpoint {root} has no config.json; expected {expected}")
    try:
        hf_config = AutoConfig.from_pretrained(root, local_files_only=True)
    except (OSError, ValueError, KeyError, json.JSONDecodeError) as exc:
        raise ModelLoadError(f"checkpoint {root}: config.json is not a valid model config ({exc})") from exc
    if type(hf_config) not in AutoModelForCausalLM._model_mapping:
        raise ModelLoadError(
            f"checkpoint {root} holds a {hf_config.model_type!r} model, which is not a causal LM; "
            "expected a causal language model (e.g. llama)"
        )
    if not (root / WEIGHTS_FILE).is_file():
        found = sorted(p.name for p in root.iterdir())
        raise ModelLoadError(
            f"checkpoint {root} has no {WEIGHTS_FILE} (found {found}); expected safetensors weights "
            "(pickled .bin weights are refused)"
        )
    missing = [name for name in TOKENIZER_FILES if not (root / name).is_file()]
    if missing:
        raise ModelLoadError(
            f"checkpoint {root} has no tokenizer ({', '.join(missing)} missing); expected {expected}"
        )
    try:
        tokenizer = AutoTokenizer.from_pretrained(root, local_files_only=True)
        with _quiet_progress():
            model = AutoModelForCausalLM.from_pretrained(root, local_files_only=True, use_safetensors=True)
    except (OSError, ValueError, RuntimeError) as exc:
        raise ModelLoadError(f"checkpoint {root} could not be loaded: {exc}") from exc
    if tokenizer.eos_token_id is None or tokenizer.pad_token_id is None:
        raise ModelLoadError(
            f"checkpoint {root}: the tokenizer defines no eos or pad token; generation needs both"
        )
    vocab = model.get_input_embeddings().num_embeddings
    if vocab != len(tokenizer):
        raise ModelLoadError(
            f"checkpoint {root}: model vocabulary size {vocab} does not match the tokenizer's "
            f"{len(tokenizer)}; expected the tokenizer the model was trained with"
        )
    model.eval()
    return model, tokenizer
