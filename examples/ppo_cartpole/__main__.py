"""``python -m examples.ppo_cartpole [--config-name NAME] [--resume] [OVERRIDE ...]``

Hydra composes the config from this folder (``disaggregated`` by default), so every Hydra
override works: ``algo.iterations=50``, ``run.output_dir=/tmp/ppo``, ``+algo.ent_coef=0.0``.
Run it from the repository root (Ray's workers import ``examples`` from the driver's directory).
"""

import sys
from pathlib import Path

from rlinfra.driver import run_module

if __name__ == "__main__":
    sys.exit(run_module(Path(__file__).parent, "examples.ppo_cartpole.job:PPOJob"))
