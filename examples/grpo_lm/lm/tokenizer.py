"""A character-level tokenizer for the arithmetic task, built locally so the job never downloads anything.

Character-level because the task is digit manipulation: one token per digit keeps the model's job
(carry propagation) visible at the token level, and a 15-token vocabulary keeps the embedding and the
softmax negligible next to the transformer blocks.
"""

from __future__ import annotations

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

PAD, BOS, EOS = "<pad>", "<bos>", "<eos>"
SPECIALS = (PAD, BOS, EOS)
CHARS = tuple("0123456789+=")


def vocabulary() -> dict[str, int]:
    """Specials first so pad is id 0: a zero-initialised or zero-padded tensor then reads as padding."""
    return {tok: i for i, tok in enumerate((*SPECIALS, *CHARS))}


def build_tokenizer() -> PreTrainedTokenizerFast:
    """The job's tokenizer: every prompt gets a leading <bos>, decoding concatenates characters.

    Unknown characters fail loudly at encode time (no <unk> token): a prompt outside the task's alphabet
    is a bug in the caller, not something to silently map to a catch-all id.
    """
    vocab = vocabulary()
    core = Tokenizer(models.WordLevel(vocab=vocab))
    # Special tokens are matched before pre-tokenisation, so "<eos>" in text still maps to one id.
    core.add_special_tokens(list(SPECIALS))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A $B", special_tokens=[(BOS, vocab[BOS])]
    )
    core.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token=PAD,
        bos_token=BOS,
        eos_token=EOS,
        padding_side="left",  # generation appends on the right, so prompts line up on their last token
        model_input_names=["input_ids", "attention_mask"],
    )
