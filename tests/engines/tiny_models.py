"""Tiny random-init Hugging Face checkpoints of the architectures users post-train, for the engine
tests: each with the GRPO job's tokenizer (a 15-token vocabulary, which vLLM pads to 64), GQA
(4 query heads, 2 key/value heads; head_dim 32, which vLLM's CPU attention supports) and two
layers, so that vLLM starts it in seconds. ``qwen2_tied`` ties the embeddings, as the small Qwen
models ship."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM

from tests.examples.job_checks import GRPO_START

COMMON = {
    "vocab_size": 15,
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "max_position_embeddings": 64,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
    "tie_word_embeddings": False,
}
# name -> (model_type, what differs from COMMON)
ARCHITECTURES: dict[str, tuple[str, dict]] = {
    "llama": ("llama", {}),
    "qwen2": ("qwen2", {}),
    "qwen2_tied": ("qwen2", {"tie_word_embeddings": True}),
    "qwen3": ("qwen3", {}),
    "mistral": ("mistral", {"sliding_window": None}),
    "phi3": ("phi3", {}),
    "gemma": ("gemma", {"tie_word_embeddings": True}),
}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def make_checkpoint(name: str, folder: Path, seed: int = 0) -> Path:
    """Write the tiny ``name`` checkpoint (float32 safetensors, config, tokenizer) into ``folder``."""
    model_type, changes = ARCHITECTURES[name]
    settings = {**COMMON, **changes}
    if model_type == "phi3":  # its head size is hidden / heads; it takes no head_dim
        settings.pop("head_dim")
    config = AutoConfig.for_model(model_type, **settings)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    for file in TOKENIZER_FILES:
        shutil.copy(GRPO_START / file, folder / file)
    return folder


def hf_logprobs(model, sequences: list[tuple[list[int], list[int]]]) -> list[list[float]]:
    """The model's log-probs of each completion's tokens given what precedes them (temperature 1)."""
    answers = []
    with torch.no_grad():
        for prompt, completion in sequences:
            ids = torch.tensor([[*prompt, *completion]])
            logits = model(ids).logits[0].float().log_softmax(-1)
            positions = range(len(prompt) - 1, len(prompt) + len(completion) - 1)
            answers.append([float(logits[p, token]) for p, token in zip(positions, completion, strict=True)])
    return answers
