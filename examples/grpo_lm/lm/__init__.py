"""The pure ML core of the GRPO job: torch + transformers + tokenizers, no Ray, no rlinfra."""
