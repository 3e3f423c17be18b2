"""``python -m examples.grpo_lm [--config-name NAME] [--resume] [OVERRIDE ...]``

Hydra composes the config from this folder (``disaggregated`` by default), so every Hydra
override works: ``algo.updates=50``, ``run.output_dir=/tmp/grpo``, ``algo.kl_coef=0.02``.
Run it from the repository root (Ray's workers import ``examples`` from the driver's directory).
"""

import sys
from pathlib import Path

from rlinfra.driver import run_module

if __name__ == "__main__":
    sys.exit(run_module(Path(__file__).parent, "examples.grpo_lm.job:GRPOJob"))
