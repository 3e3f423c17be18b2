"""Generation throughput: the engine against Hugging Face ``model.generate`` on the same batch.

Both sample (temperature 1, no top-k/top-p) prompts_per_step x G completions with a KV cache and stop
rows at <eos>; tokens counted are the completion tokens each returns (up to and including <eos>).

Run from the repository root:  python -m examples.grpo_lm.lm.throughput [--checkpoint DIR]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from .config import GRPOConfig
from .engine import GenerationEngine
from .model import load_pretrained
from .task import PromptSampler
from .warmup import warm_start


@dataclass
class Throughput:
    tokens: int
    seconds: float

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


def engine_throughput(
    engine: GenerationEngine, batches: Sequence[Sequence[str]], group: int, max_new_tokens: int
) -> Throughput:
    tokens, start = 0, time.perf_counter()
    for i, prompts in enumerate(batches):
        completions = engine.generate(prompts, group, max_new_tokens, temperature=1.0, seed=i)
        tokens += sum(len(c.completion_ids) for c in completions)
    return Throughput(tokens, time.perf_counter() - start)


def hf_generate_throughput(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    batches: Sequence[Sequence[str]],
    group: int,
    max_new_tokens: int,
) -> Throughput:
    """``model.generate`` with the same prompts, G, budget and sampling distribution as the engine."""
    eos = int(tokenizer.eos_token_id)
    tokens, start = 0, time.perf_counter()
    for i, prompts in enumerate(batches):
        torch.manual_seed(i)
        enc = tokenizer(list(prompts), padding=True, padding_side="left", return_tensors="pt")
        with torch.no_grad():
            out = model.generate(  # type: ignore[operator]  # nn.Module.__getattr__ hides GenerationMixin
                **enc,
                do_sample=True,
                temperature=1.0,
                top_k=0,
                top_p=1.0,
                max_new_tokens=max_new_tokens,
                num_return_sequences=group,
                pad_token_id=tokenizer.pad_token_id,
                eos_token_id=eos,
            )
        new = out[:, enc["input_ids"].shape[1] :]
        # Up to and including the first <eos>; generate pads finished rows with pad afterwards.
        is_eos = (new == eos).int()
        after_eos = (is_eos.cumsum(dim=1) - is_eos) > 0
        tokens += int((~after_eos).sum())
    return Throughput(tokens, time.perf_counter() - start)


def compare(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    config: GRPOConfig,
    batches: int = 20,
    rounds: int = 3,
) -> tuple[float, float]:
    """(engine tokens/s, generate tokens/s), each the best of ``rounds`` interleaved rounds, so a
    burst of load from another process penalises neither side more than the other."""
    model.eval()
    sampler = PromptSampler(config.seed)
    prompt_batches = [sampler.sample(config.prompts_per_step) for _ in range(batches)]
    engine = GenerationEngine(model, tokenizer)
    g, n = config.group_size, config.max_new_tokens
    engine_throughput(engine, prompt_batches[:2], g, n)  # warm both paths up
    hf_generate_throughput(model, tokenizer, prompt_batches[:2], g, n)
    ours, theirs = [], []
    for _ in range(rounds):
        ours.append(engine_throughput(engine, prompt_batches, g, n).tokens_per_s)
        theirs.append(hf_generate_throughput(model, tokenizer, prompt_batches, g, n).tokens_per_s)
    return max(ours), max(theirs)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--checkpoint", default=None, help="default: the cached warm start of GRPOConfig()")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batches", type=int, default=20)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    config = GRPOConfig()
    path = args.checkpoint or warm_start(config.cache_dir, config)
    model, tokenizer = load_pretrained(path)
    ours, theirs = compare(model, tokenizer, config, batches=args.batches)
    print(
        f"engine {ours:,.0f} tokens/s | model.generate {theirs:,.0f} tokens/s | ratio {ours / theirs:.2f}x "
        f"({config.prompts_per_step} prompts x {config.group_size} samples, "
        f"{config.max_new_tokens} new tokens)"
    )


if __name__ == "__main__":
    main()
