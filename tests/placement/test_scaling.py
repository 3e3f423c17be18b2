"""Linear growth, checked as a ratio measured within the test (never against absolute time).

RLinf materialises placements in O(processes x nodes), about 20 s for 1,000 nodes x 8 GPUs; ours
must stay linear. Four times the nodes may cost about four times as long; 12x leaves room for
noise on a shared machine while still failing a quadratic algorithm (which would be ~16x).
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from rlinfra.placement import ClusterSpec, ComponentPlacement

GPUS_PER_NODE = 8


def resolve(num_nodes: int, entry: Any) -> ComponentPlacement:
    """A fresh spec each time: resource pools are cached per spec and must not be reused."""
    cluster = {"num_nodes": num_nodes, "component_placement": {"actor": entry}}
    return ComponentPlacement({"cluster": cluster}, ClusterSpec.from_config(cluster, GPUS_PER_NODE))


def best_of_three(num_nodes: int, entry: Any) -> float:
    times = []
    for _ in range(3):
        start = time.perf_counter()
        resolve(num_nodes, entry)
        times.append(time.perf_counter() - start)
    return min(times)


@pytest.mark.parametrize(
    "entry",
    [
        pytest.param(lambda n: "all", id="all-gpus"),
        pytest.param(lambda n: f"all:0-{n * GPUS_PER_NODE // 2 - 1}", id="two-gpus-per-process"),
        pytest.param(lambda n: {"node_group": "node", "placement": f"all:0-{n * 8 - 1}"}, id="8-per-node"),
    ],
)
def test_resolving_grows_linearly(entry: Any) -> None:
    resolve(100, entry(100))  # warm up imports and caches outside the measurement
    small = best_of_three(1000, entry(1000))
    large = best_of_three(4000, entry(4000))
    assert large < 12 * small, f"1000 nodes: {small:.4f}s, 4000 nodes: {large:.4f}s ({large / small:.1f}x)"


def test_big_plan_is_correct_at_the_edges() -> None:
    placements = resolve(4000, "all").get_placements("actor")
    assert len(placements) == 32_000
    last = placements[-1]
    assert (last.rank, last.cluster_node_rank, last.local_rank) == (31_999, 3999, 7)
    assert last.visible_devices == "7"
    assert last.placement_node_rank == 3999
    assert last.local_world_size == GPUS_PER_NODE
