"""Second main job: GRPO on a small Hugging Face transformer (pure ML core in lm/)."""
