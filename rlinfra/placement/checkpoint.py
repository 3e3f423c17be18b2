"""What a component's checkpoint is, read from its ``config.json`` alone: the architecture, and
the parameter count of the model Hugging Face builds from that config on the ``meta`` device (no
memory, no weights: a 70B model is counted on a laptop from its 1 KB config, tied embeddings
counted once). The plan shows it beside the processes that hold the model."""

import functools
from dataclasses import dataclass

from rlinfra.config import ConfigError
from rlinfra.placement.model_size import ARCHITECTURES, parameter_count, read_model_config


@dataclass(frozen=True)
class Checkpoint:
    """``architecture`` is None where there is no readable ``config.json`` here (a path on the
    cluster's nodes); ``parameters`` None where transformers cannot build the architecture."""

    path: str
    architecture: str | None
    parameters: int | None

    def describe(self) -> str:
        if self.architecture is None:
            return f"{self.path}: no config.json on this machine"
        count = "parameters unknown" if self.parameters is None else f"{_short(self.parameters)} parameters"
        return f"{self.architecture}, {count}"


@functools.cache  # the plan's table and its JSON, and each component a key names, ask alike
def describe_checkpoint(path: str) -> Checkpoint:
    try:
        config = read_model_config(path)
    except ConfigError:
        return Checkpoint(path, None, None)
    architecture = ",".join(config.get("architectures") or [config.get("model_type", "unknown")])
    counted = config.get("model_type") in ARCHITECTURES
    return Checkpoint(path, architecture, parameter_count(config) if counted else _count_parameters(path))


def _count_parameters(path: str) -> int | None:
    """Other architectures: what transformers builds on the ``meta`` device, where it knows them."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        config = AutoConfig.from_pretrained(path)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
    except (ValueError, KeyError, ImportError, OSError):  # an architecture transformers does not know
        return None
    return sum(parameter.numel() for parameter in model.parameters())


def _short(count: int) -> str:
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if count >= scale:
            return f"{count / scale:.2f}{unit}"
    return str(count)
