"""The GRPO job's generation engine on vLLM (``engine: {name: vllm}``): rlinfra's ``VLLMEngine``
with the job's two calls, ``generate`` and ``evaluate``, answering exactly as the job's own
sampler does (``workers.RolloutWorker``): the same tokenization, ``Completion``s, version stamps.

vLLM samples and computes the log-probs; this module only turns text into token ids and back with
the checkpoint's tokenizer, so that the learner and the reward workers cannot tell the engines
apart. A module of its own: only the processes that host a vLLM engine import it.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from examples.grpo_lm.lm.completion import Completion
from examples.grpo_lm.lm.config import GRPOConfig
from examples.grpo_lm.lm.task import exact_match
from rlinfra.driver import Batch
from rlinfra.engines.vllm import VLLMEngine, VLLMSettings


class VLLMSampler:
    """``GenerationEngine.generate``'s signature and answers over a ``VLLMEngine``."""

    def __init__(self, engine: VLLMEngine, tokenizer: Any) -> None:
        self.engine, self.tokenizer = engine, tokenizer
        self.eos_id = int(tokenizer.eos_token_id)

    def generate(
        self,
        prompts: Sequence[str],
        samples_per_prompt: int = 1,
        max_new_tokens: int = 8,
        temperature: float = 1.0,
        greedy: bool = False,
        seed: int | None = None,
    ) -> list[Completion]:
        prompt_ids = [self.tokenizer(prompt)["input_ids"] for prompt in prompts]
        sampled = self.engine.sample(
            prompt_ids, samples_per_prompt, max_new_tokens, temperature=temperature, seed=seed, greedy=greedy
        )
        bodies = [s.token_ids[:-1] if s.finished else s.token_ids for s in sampled]
        texts = self.tokenizer.batch_decode(bodies, skip_special_tokens=False)
        return [
            Completion(
                prompt=prompts[row // samples_per_prompt],
                prompt_ids=s.prompt_ids,
                completion_ids=s.token_ids,
                logprobs=s.logprobs,
                finished=s.finished and s.token_ids[-1:] == [self.eos_id],
                text=text,
                weight_version=s.version,
            )
            for row, (s, text) in enumerate(zip(sampled, texts, strict=True))
        ]


class VLLMRolloutWorker(VLLMEngine):
    """One vLLM engine of the job: G completions per prompt, each stamped with its version."""

    def __init__(self, algo: GRPOConfig, start_path: str, settings: Mapping[str, Any]) -> None:
        from transformers import AutoTokenizer

        self.config = algo
        super().__init__(VLLMSettings(model=start_path, seed=self.config.seed, **settings))
        self.sampler = VLLMSampler(self, AutoTokenizer.from_pretrained(start_path, local_files_only=True))

    def generate(self, batch_id: str, prompts: Sequence[str], seed: int) -> Batch:
        cfg, started = self.config, time.perf_counter()
        completions = self.sampler.generate(
            prompts, cfg.group_size, cfg.max_new_tokens, temperature=cfg.temperature, seed=seed
        )
        made = {
            "completions": completions,
            "tokens": sum(len(c.completion_ids) for c in completions),
            "cache_dropped": True,  # vLLM's prefix cache is reset by every swap (weights_loaded)
            "seconds": time.perf_counter() - started,
        }
        return Batch(batch_id, completions[0].weight_version, made)  # one call, one version: stamped on each

    def evaluate(self, prompts: Sequence[str]) -> tuple[int, float]:
        """Greedy held-out exact match at the serving version: (version, accuracy)."""
        completions = self.sampler.generate(prompts, 1, self.config.max_new_tokens, greedy=True)
        texts, finished = [c.text for c in completions], [c.finished for c in completions]
        return completions[0].weight_version, exact_match(prompts, texts, finished)
