"""Seed 000's example program, unchanged except its import line, runs on a simulated 1x8 node."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

pytestmark = [pytest.mark.timeout(180), pytest.mark.ray]

# The seed's program, verbatim but for `from rlinfra import ...` (was `from rlinf.scheduler ...`).
SEED_PROGRAM = """
import hydra
from rlinfra import Cluster, ComponentPlacement, Worker

class TestWorker(Worker):
    def __init__(self):
        super().__init__()

    def run(self):
        self.log_info(f"Hello from TestWorker rank {self._rank}!")

# 示例：YAML 配置文件名为 "conf.yaml"
@hydra.main(version_base=None, config_path=".", config_name="conf")
# cfg 即解析后的 YAML 配置
def main(cfg):
    # 使用配置初始化集群对象
    cluster = Cluster(cluster_cfg=cfg.cluster)

    # 创建 ComponentPlacement，解析放置规则
    placement = ComponentPlacement(cfg, cluster)

    # 获取组件 "test_worker" 对应的放置策略
    strategy = placement.get_strategy("test_worker")

    # 按照放置策略启动 TestWorker
    worker = TestWorker.create_group().launch(
        cluster, placement_strategy=strategy
    )
    worker.run().wait()

main()
"""

# The seed's conf.yaml plus one line: `simulate: 1x8` (one simulated node with 8 logical GPUs).
CONF = """
cluster:
  num_nodes: 1
  simulate: 1x8
  component_placement:
    test_worker:  # 组件名称
      node_group: a800
      placement: 0-3  # 在节点组 a800（仅包含节点 0）上的 GPU 0-3 各启动一个进程

  node_groups:
    - label: a800
      node_ranks: 0
"""


def test_seed_program_runs_unchanged(tmp_path: Path) -> None:
    (tmp_path / "seed_program.py").write_text(SEED_PROGRAM)
    (tmp_path / "conf.yaml").write_text(CONF)
    # A short private Ray temp root: its worker logs are where the program's log_info lines land,
    # and Unix socket paths must stay under ~100 characters.
    ray_tmp = tempfile.mkdtemp(prefix="rls")
    env = {**os.environ, "RAY_TMPDIR": ray_tmp, "HYDRA_FULL_ERROR": "1"}
    env.pop("RAY_ADDRESS", None)
    result = subprocess.run(
        [sys.executable, "seed_program.py", f"hydra.run.dir={tmp_path / 'out'}"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=150,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    logs = "".join(
        path.read_text(errors="replace") for path in Path(ray_tmp).glob("ray/session_*/logs/worker-*.err")
    )
    for rank in range(4):
        assert f"[testworker:{rank}] INFO Hello from TestWorker rank {rank}!" in logs
    assert "Hello from TestWorker rank 4!" not in logs
