"""RLinf's behaviours that embodied RL relies on, on a real simulated cluster.

Node 0 has 4 logical GPUs and two Franka arms (a ``gpu`` and a ``franka`` node group sharing the
node); node 1 is a CPU-only node with 4 logical CPUs. One ``env`` component spans both kinds, as
RLinf allows (``node_group: "gpu,franka"``, ``placement: "0,4"``): a simulator on GPU 0 and a
worker driving the first arm, each checked from inside its process. 32 agent processes share
node 1's 4 CPUs (the seed example's shape, scaled down), and a reservation no node can hold fails
in seconds instead of waiting out the deadline.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from rlinfra import Cluster, ComponentPlacement, Worker
from rlinfra.runtime.layout import ReservationError

FRANKA = {
    "type": "franka",
    "configs": [{"node_rank": 0, "robot_ip": "10.0.0.8"}, {"node_rank": 0, "robot_ip": "10.0.0.9"}],
}
CFG: dict[str, Any] = {
    "cluster": {
        "num_nodes": 2,
        "simulate": "4,0",
        "simulate_cpus": 4,
        "component_placement": {
            "env": {"node_group": "gpu,franka", "placement": "0,4"},
            "agent": {"node_group": "node", "placement": "1:0-31"},
            "hungry": {"node_group": "node", "placement": "1:0-1", "num_cpus": 3},
        },
        "node_groups": [
            {
                "label": "gpu",
                "node_ranks": 0,
                "env_configs": [{"node_ranks": 0, "env_vars": [{"SIM": "isaac"}]}],
            },
            {
                "label": "franka",
                "node_ranks": 0,
                "hardware": FRANKA,
                "env_configs": [{"node_ranks": "ALL", "env_vars": {"ROBOT_NET": "lan"}}],
            },
        ],
    }
}
pytestmark = [pytest.mark.timeout(240), pytest.mark.cluster(CFG), pytest.mark.ray]


class Probe(Worker):
    def report(self) -> dict[str, Any]:
        return {
            "rank": self._rank,
            "world_size": self._world_size,
            "name": self.worker_address.get_name(),
            "node": self._cluster_node_rank,
            "hardware_type": self.hardware_type,
            "has_accelerator": self.has_accelerator,
            "hardware_infos": self.hardware_infos,
            "local_accelerator_rank": self._local_accelerator_rank,
            "group": (self._group_name, self._worker_name),
            "platform": (
                self.accelerator_type,
                self.torch_device_type,
                getattr(self.torch_platform, "__name__", None),
            ),
            "env": {name: os.environ.get(name) for name in ("CUDA_VISIBLE_DEVICES", "SIM", "ROBOT_NET")},
        }


def test_one_env_component_drives_a_gpu_simulator_and_a_robot(
    cluster: Cluster, placement: ComponentPlacement
) -> None:
    env = Probe.create_group().launch(cluster, placement.get_strategy("env"), name="env")
    try:
        simulator, robot = env.report().wait(timeout=60)
    finally:
        env.shutdown()
    assert simulator["name"] == "env:0" and robot["name"] == "env:1"
    assert (simulator["group"], robot["group"]) == (("env", "env:0"), ("env", "env:1"))
    assert simulator["platform"] == robot["platform"] == ("GPU", "cuda", "torch.cuda")  # the node's
    assert (simulator["hardware_type"], simulator["has_accelerator"]) == ("GPU", True)
    assert (simulator["local_accelerator_rank"], simulator["hardware_infos"]) == (0, [])
    assert simulator["env"] == {"CUDA_VISIBLE_DEVICES": "0", "SIM": "isaac", "ROBOT_NET": None}
    assert (robot["hardware_type"], robot["has_accelerator"], robot["node"]) == ("franka", False, 0)
    assert robot["hardware_infos"] == [{"type": "franka", "node_rank": 0, "robot_ip": "10.0.0.8"}]
    assert (robot["env"]["SIM"], robot["env"]["ROBOT_NET"]) == (None, "lan")
    # As in RLinf, a process on a robot is not restricted to some GPUs: it sees its node's.
    assert robot["env"]["CUDA_VISIBLE_DEVICES"] is None


def test_32_node_processes_share_a_4_cpu_node(cluster: Cluster, placement: ComponentPlacement) -> None:
    """Each worker holding a whole CPU, 32 agents could never fit on 4 CPUs; sharing, they do."""
    agents = Probe.create_group().launch(cluster, placement.get_strategy("agent"), name="agent")
    try:
        reports = agents.report().wait(timeout=120)
        reserved = {row.num_cpus for row in agents.reservations}
    finally:
        agents.shutdown()
    assert [report["rank"] for report in reports] == list(range(32))
    assert {report["node"] for report in reports} == {1}
    assert reserved == {0.0312}  # 1/32 of the node's one shared CPU, rounded down


def test_a_reservation_no_node_can_hold_fails_in_seconds(
    cluster: Cluster, placement: ComponentPlacement
) -> None:
    """Two processes asking 3 CPUs each on a 4-CPU node: Ray would wait for ever."""
    started = time.monotonic()
    with pytest.raises(ReservationError) as caught:
        Probe.create_group().launch(
            cluster, placement.get_strategy("hungry"), name="hungry", launch_timeout=60
        )
    elapsed = time.monotonic() - started
    assert elapsed < 5, elapsed
    message = str(caught.value)
    assert "worker group 'hungry'" in message
    assert "node 1: CPU=6 requested, 4 in total (short by 2)" in message


# An RLinf driver that places by hand with the three strategies, RLinf's argument names and
# RLinf's attributes; only its import line differs from what RLinf users write.
DRIVER = """
from omegaconf import OmegaConf
from rlinfra import (
    Cluster,
    FlexiblePlacementStrategy,
    NodePlacementStrategy,
    PackedPlacementStrategy,
    Worker,
    WorkerAddress,
)

class Hello(Worker):
    def __init__(self):
        super().__init__()

    def where(self):
        import os
        return (self._rank, self._world_size, self.worker_address.get_name(), self._cluster_node_rank,
                os.environ.get("CUDA_VISIBLE_DEVICES") or "-", self.accelerator_type, self.torch_device_type)

cfg = OmegaConf.create({"cluster": {"num_nodes": 2, "simulate": "4,4", "simulate_cpus": 4}})
cluster = Cluster(cluster_cfg=cfg.cluster)
print("cluster", cluster.num_nodes, cluster.num_accelerators)
def show(group):
    for row in group.where().wait():
        print(*row)

flexible = FlexiblePlacementStrategy([[5], [0]], node_group_label=None)
strided = PackedPlacementStrategy(0, 7, num_hardware_per_process=2, stride=2)
for name, strategy in (("flexible", flexible), ("packed", strided), ("nodes", NodePlacementStrategy([1, 0]))):
    group = Hello.create_group().launch(cluster, placement_strategy=strategy, name=name)
    show(group)
    if name == "packed":
        print("subset", [row[0] for row in group.execute_on(3, 1).where().wait()])
    group.shutdown()
default = Hello.create_group().launch(cluster, name="default")
show(default)
default.shutdown()
print("address", WorkerAddress.from_name("packed:3").get_parent_address().get_name())
cluster.shutdown()
"""


def test_an_rlinf_driver_with_hand_built_strategies_runs_with_its_imports_changed(tmp_path: Path) -> None:
    (tmp_path / "driver.py").write_text(DRIVER)
    env = {**os.environ, "RAY_TMPDIR": tempfile.mkdtemp(prefix="rlc")}
    env.pop("RAY_ADDRESS", None)
    result = subprocess.run(
        [sys.executable, "driver.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [
        line
        for line in result.stdout.splitlines()
        if line.split(" ")[0] in {"cluster", "subset", "address"} or line[:1].isdigit()
    ]
    assert lines == [
        "cluster 2 8",
        # Flexible sorts by first rank: rank 0 on GPU 0 of node 0, rank 1 on GPU 1 of node 1.
        "0 2 flexible:0 0 0 GPU cuda",
        "1 2 flexible:1 1 1 GPU cuda",
        # Packed with stride 2: GPUs 0,2 / 1,3 on node 0, then 4,6 / 5,7 = node 1's 0,2 / 1,3.
        "0 4 packed:0 0 0,2 GPU cuda",
        "1 4 packed:1 0 1,3 GPU cuda",
        "2 4 packed:2 1 0,2 GPU cuda",
        "3 4 packed:3 1 1,3 GPU cuda",
        "subset [3, 1]",
        # Node ranks are sorted: rank 0 on node 0; whole-node processes see every GPU of the node.
        "0 2 nodes:0 0 - GPU cuda",
        "1 2 nodes:1 1 - GPU cuda",
        # No strategy: RLinf's default, one process per accelerator of the cluster.
        *[f"{rank} 8 default:{rank} {rank // 4} {rank % 4} GPU cuda" for rank in range(8)],
        "address packed",
    ]
