"""What needs no cluster is refused before Ray starts: a misspelt component (named, with the
nearest of the job's), a placement on accelerators the declared cluster does not have (with its
caret), and a memory plan that overfills a device. Checked in a fresh process, which must end
with Ray never started."""

from __future__ import annotations

import json
import os
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


def test_rlinfra_plan_refuses_a_jobs_mistakes_with_the_message_run_gives(tmp_path: Path) -> None:
    """``rlinfra plan`` of a job's config checks what ``rlinfra run`` checks before Ray starts:
    its components, its sections' keys and its entrypoint, with the same messages."""
    written = (ROOT / "examples/bandit/bandit.yaml").read_text()
    mistakes = {
        "component": (
            written.replace("    rollout: {", "    rollouts: {"),
            "cluster.component_placement: unknown component 'rollouts'; did you mean 'rollout'?",
        ),
        "key": (written.replace("  pulls: 64", "  pullz: 64"), "unknown key 'pullz'; did you mean 'pulls'?"),
        "entrypoint": (written.replace("bandit.job:", "bandit.jobz:"), "cannot import 'examples.bandit.jobz"),
    }
    for name, (text, message) in mistakes.items():
        path = tmp_path / f"{name}.yaml"
        path.write_text(text)
        for command in ("plan", "run"):
            done = subprocess.run(
                [sys.executable, "-m", "rlinfra.cli.main", command, str(path)],
                cwd=ROOT, capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "250"},
            )  # fmt: skip
            assert done.returncode == 2, (command, done.stdout, done.stderr)
            assert message in done.stderr and "Traceback" not in done.stderr, (command, done.stderr)
            assert "Node × device map" not in done.stdout  # refused before anything was shown
