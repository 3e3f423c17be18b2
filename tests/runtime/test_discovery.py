"""Node ranking from Ray's node table: explicit labels, head first, IPs as numbers, node id."""

import pytest

from rlinfra.runtime.discovery import HEAD_RESOURCE, NODE_RANK_LABEL, rank_nodes
from rlinfra.runtime.errors import ClusterError


def node(node_id, ip, head=False, labels=None, alive=True, gpus=0):
    resources = {"CPU": 8.0}
    if gpus:
        resources["GPU"] = float(gpus)
    if head:
        resources[HEAD_RESOURCE] = 1.0
    return {
        "NodeID": node_id,
        "NodeManagerAddress": ip,
        "Alive": alive,
        "Resources": resources,
        "Labels": labels or {},
    }


def test_head_first_then_ip_as_numbers_not_strings():
    nodes = [node("c", "10.0.0.66"), node("a", "10.0.0.7"), node("h", "10.0.0.99", head=True)]
    ranked = rank_nodes(nodes)
    assert [n.node_id for n in ranked] == ["h", "a", "c"]  # 10.0.0.7 < 10.0.0.66 numerically
    assert [n.rank for n in ranked] == [0, 1, 2]


def test_same_ip_falls_back_to_node_id_and_dead_nodes_are_skipped():
    nodes = [node("b2", "127.0.0.1"), node("a1", "127.0.0.1"), node("zz", "127.0.0.1", alive=False)]
    assert [n.node_id for n in rank_nodes(nodes)] == ["a1", "b2"]


def test_explicit_labels_win_over_head_and_ip():
    nodes = [
        node("h", "10.0.0.1", head=True, labels={NODE_RANK_LABEL: "1"}),
        node("w", "10.0.0.2", labels={NODE_RANK_LABEL: "0"}),
    ]
    assert [n.node_id for n in rank_nodes(nodes)] == ["w", "h"]


@pytest.mark.parametrize(
    ("labels", "message"),
    [
        (["0", "0"], "numbered 0..1, each once"),
        (["0", "2"], r"numbered 0..1, each once; found \['0', '2'\]"),
        (["x", "0"], "numbered 0..1, each once"),
    ],
)
def test_bad_labels_are_clear_errors(labels, message):
    nodes = [node(f"n{i}", "10.0.0.1", labels={NODE_RANK_LABEL: value}) for i, value in enumerate(labels)]
    with pytest.raises(ClusterError, match=message):
        rank_nodes(nodes)


def test_accelerator_reads_ray_resources():
    ranked = rank_nodes([node("g", "10.0.0.1", gpus=4), node("c", "10.0.0.2")])
    assert ranked[0].accelerator == ("GPU", 4)
    assert ranked[1].accelerator == ("GPU", 0)
