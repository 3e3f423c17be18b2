"""What needs no cluster is refused before Ray starts: a misspelt component (named, with the
nearest of the job's), a placement on accelerators the declared cluster does not have (with its
caret), and a memory plan that overfills a device. Checked in a fresh process, which must end
with Ray never started."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROGRAM = """
import json, sys
import ray
from examples.bandit.job import Bandit
from rlinfra.config import ConfigError
from rlinfra.config.loading import load_config
from omegaconf import OmegaConf

refusals = []
for change in json.loads(sys.argv[1]):
    cfg = load_config(__import__("pathlib").Path("examples/bandit/bandit.yaml"))
    cfg.cluster.component_placement = change.pop("component_placement")
    for key, value in change.items():
        OmegaConf.update(cfg, key, value, force_add=True)
    try:
        Bandit.run(cfg)
        refusals.append(None)
    except ConfigError as error:
        refusals.append(str(error))
print(json.dumps({"refusals": refusals, "ray_started": ray.is_initialized()}))
"""
QWEN = "examples/memory/qwen2.5-7b.json"


def test_mistakes_that_need_no_cluster_are_refused_before_ray_starts():
    changes = [
        {"component_placement": {"actor": 0, "rollouts": "1-2"}},
        {"component_placement": {"actor": 0, "rollout": "1-5"}},
        {
            "component_placement": {
                "actor": {"placement": 0, "model": QWEN, "memory": {"role": "trainer"}},
                "rollout": "1-2",
            },
            "cluster.accelerator": "H100",
        },
    ]
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM, json.dumps(changes)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    outcome = json.loads(done.stdout.splitlines()[-1])
    misspelt, too_far, overfull = outcome["refusals"]
    assert misspelt.startswith(
        "cluster.component_placement: unknown component 'rollouts'; did you mean 'rollout'?"
    )
    assert "the bandit job's components: actor, rollout" in misspelt
    assert "rollout" in too_far and "1-5" in too_far and "^" in too_far
    assert "node 0 device 0: phase 'all' needs" in overfull
    assert outcome["ray_started"] is False
