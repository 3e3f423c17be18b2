"""The rollout engine: batched sampling over a causal LM's forward with a per-call KV cache.

Written against the model's forward instead of ``model.generate`` because GRPO needs exactly what
``generate`` makes awkward: the log-probability of every sampled token under the sampling policy,
per-row stopping at <eos> with the rest masked, and a guarantee about the cache's lifetime. The cache
is created at the start of each ``generate`` call and unreachable when it returns: cached keys and
values are a function of the weights, so a cache that outlived a weight swap would silently mix two
policies into one sample. ``cache_alive`` lets callers (and tests) check that guarantee.
"""

from __future__ import annotations

import inspect
import weakref
from collections.abc import Mapping, Sequence

import torch
from transformers import DynamicCache, PreTrainedModel, PreTrainedTokenizerBase

from .completion import Completion


class GenerationEngine:
    """Samples completions from ``model``. Not thread-safe: one ``generate`` at a time per engine."""

    def __init__(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> None:
        if tokenizer.pad_token_id is None or tokenizer.eos_token_id is None:
            raise ValueError("the tokenizer needs a pad and an eos token")
        self.model = model
        self.tokenizer = tokenizer
        self.pad_id = int(tokenizer.pad_token_id)
        self.eos_id = int(tokenizer.eos_token_id)
        self.weight_version = 0
        self._cache_ref: weakref.ref[DynamicCache] | None = None
        self._in_flight = False
        params = inspect.signature(model.forward).parameters
        # transformers 5 renamed past_key_values to cache (the old name still works, with a warning).
        self._cache_kwarg = "cache" if "cache" in params else "past_key_values"
        self._cache_takes_config = "config" in inspect.signature(DynamicCache.__init__).parameters

    @property
    def cache_alive(self) -> bool:
        """Whether the KV cache of the last ``generate`` call still exists anywhere in the process.

        A weak reference, not a flag: it turns False only once nothing at all holds the cache, which
        is the property a weight swap needs.
        """
        return self._cache_ref is not None and self._cache_ref() is not None

    def load_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        """Swap in new policy weights. Refused mid-generation or while an old cache lives, so no sample
        can ever mix the keys and values of two weight versions."""
        if self._in_flight or self.cache_alive:
            raise RuntimeError("cannot swap weights while a generation (or its KV cache) is alive")
        self.model.load_state_dict(state_dict)
        self.weight_version = version

    @torch.no_grad()
    def generate(
        self,
        prompts: Sequence[str],
        samples_per_prompt: int = 1,
        max_new_tokens: int = 8,
        temperature: float = 1.0,
        greedy: bool = False,
        seed: int | None = None,
    ) -> list[Completion]:
        """``samples_per_prompt`` completions per prompt, grouped: results[i*G:(i+1)*G] share prompt i.

        Log-probs are under softmax(logits / temperature), the distribution actually sampled from
        (greedy picks its argmax, which temperature does not move). ``seed`` fixes the samples
        without touching the global torch RNG.
        """
        if samples_per_prompt < 1 or max_new_tokens < 1:
            raise ValueError("samples_per_prompt and max_new_tokens must be >= 1")
        if not greedy and temperature <= 0:
            raise ValueError(f"temperature must be > 0 for sampling, got {temperature}")
        if not prompts:
            return []
        if self._in_flight:
            raise RuntimeError("generate is not re-entrant")
        self._in_flight = True
        was_training = self.model.training
        self.model.eval()
        try:
            tokens, logprobs, lengths, finished, prompt_ids = self._sample(
                list(prompts), samples_per_prompt, max_new_tokens, temperature, greedy, seed
            )
        finally:
            self._in_flight = False
            self.model.train(was_training)
        return self._completions(
            list(prompts), samples_per_prompt, prompt_ids, tokens, logprobs, lengths, finished
        )

    def _new_cache(self) -> DynamicCache:
        return DynamicCache(config=self.model.config) if self._cache_takes_config else DynamicCache()

    def _sample(
        self,
        prompts: list[str],
        group: int,
        max_new_tokens: int,
        temperature: float,
        greedy: bool,
        seed: int | None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, list[list[int]]]:
        """The decode loop. Every tensor here is local, so the cache dies with this frame."""
        device = next(self.model.parameters()).device
        enc = self.tokenizer(prompts, padding=True, padding_side="left", return_tensors="pt")
        prompt_mask = enc["attention_mask"]
        prompt_ids = [ids[m.bool()].tolist() for ids, m in zip(enc["input_ids"], prompt_mask, strict=True)]
        input_ids, mask = enc["input_ids"].to(device), prompt_mask.to(device)
        # Left padding: a row's first real token gets position 0, whatever its padding.
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        generator = None
        if seed is not None and not greedy:
            generator = torch.Generator(device=device).manual_seed(seed)

        cache = self._new_cache()
        self._cache_ref = weakref.ref(cache)
        # Prefill each distinct prompt once, then copy its keys and values to its G samples: the G rows
        # of a group share the prompt exactly, so this saves (G - 1) / G of the prefill compute.
        logits = self._forward(input_ids, mask, positions, cache).repeat_interleave(group, dim=0)
        if group > 1:
            cache.batch_repeat_interleave(group)
        mask = mask.repeat_interleave(group, dim=0)
        next_pos = positions[:, -1:].repeat_interleave(group, dim=0) + 1
        rows = mask.shape[0]
        out_tokens = torch.full((rows, max_new_tokens), self.pad_id, dtype=torch.long, device=device)
        out_logprobs = torch.zeros((rows, max_new_tokens), dtype=torch.float32, device=device)
        finished = torch.zeros(rows, dtype=torch.bool, device=device)
        lengths = torch.zeros(rows, dtype=torch.long, device=device)
        for t in range(max_new_tokens):
            logp = torch.log_softmax(logits.float() / (1.0 if greedy else temperature), dim=-1)
            if greedy:
                token = logp.argmax(dim=-1)
            else:
                token = torch.multinomial(logp.exp(), 1, generator=generator).squeeze(-1)
            token_logp = logp.gather(-1, token[:, None]).squeeze(-1)
            active = ~finished
            out_tokens[:, t] = torch.where(active, token, self.pad_id)
            out_logprobs[:, t] = torch.where(active, token_logp, 0.0)
            lengths += active.long()
            finished = finished | (active & (token == self.eos_id))
            if bool(finished.all()) or t == max_new_tokens - 1:
                break
            # The new token is real for rows that were still running; rows already done feed pad,
            # masked out so it never becomes context for anything.
            mask = torch.cat([mask, active.long()[:, None]], dim=1)
            logits = self._forward(out_tokens[:, t : t + 1], mask, next_pos, cache)
            next_pos = next_pos + 1
        return out_tokens, out_logprobs, lengths, finished, prompt_ids

    def _forward(
        self, input_ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, cache: DynamicCache
    ) -> torch.Tensor:
        """Logits at the last position only: the lm_head over the whole prompt would be wasted work."""
        out = self.model(
            input_ids=input_ids,
            attention_mask=mask,
            position_ids=positions,
            use_cache=True,
            logits_to_keep=1,
            **{self._cache_kwarg: cache},
        )
        return out.logits[:, -1, :]

    def _completions(
        self,
        prompts: list[str],
        group: int,
        prompt_ids: list[list[int]],
        tokens: torch.Tensor,
        logprobs: torch.Tensor,
        lengths: torch.Tensor,
        finished: torch.Tensor,
    ) -> list[Completion]:
        tok_rows, lp_rows = tokens.tolist(), logprobs.tolist()
        n_rows, done_rows = lengths.tolist(), finished.tolist()
        ids = [tok_rows[r][: n_rows[r]] for r in range(len(tok_rows))]
        bodies = [row[:-1] if done else row for row, done in zip(ids, done_rows, strict=True)]
        texts = self.tokenizer.batch_decode(bodies, skip_special_tokens=False)
        return [
            Completion(
                prompt=prompts[r // group],
                prompt_ids=prompt_ids[r // group],
                completion_ids=ids[r],
                logprobs=lp_rows[r][: n_rows[r]],
                finished=bool(done_rows[r]),
                text=texts[r],
                weight_version=self.weight_version,
            )
            for r in range(len(ids))
        ]
