"""Ray-free pieces of the runtime: bundle plans, the resource ledger, split/gather, messages."""

import time

import numpy as np
import pytest

from rlinfra.placement import ClusterSpec, ComponentPlacement
from rlinfra.runtime.bundles import MIN_BUNDLE_CPU, plan_layout, reservable
from rlinfra.runtime.calls import concat_chunks, split_batch
from rlinfra.runtime.deadline import Deadline, poll
from rlinfra.runtime.errors import RankFailure, WorkerGroupError
from rlinfra.runtime.ledger import resource_diff


def placements(component_placement, counts, node_groups=None):
    cluster = {"num_nodes": len(counts), "component_placement": component_placement}
    if node_groups:
        cluster["node_groups"] = node_groups
    cfg = {"cluster": cluster}
    spec = ClusterSpec.from_config(cfg["cluster"], counts)
    plan = ComponentPlacement(cfg, spec)
    return {name: plan.get_placements(name) for name in plan.components}


def plan_bundles(placements, num_cpus=None, node_resources=None):
    """The layout of one component, named "_" (as a group launched on its own plans it)."""
    return plan_layout({"_": placements}, num_cpus, node_resources)


def test_one_bundle_per_device_ordered_by_node_then_device():
    plan = plan_bundles(placements({"actor": "2-5"}, [4, 4])["actor"])
    assert plan.bundle_nodes == [0, 0, 1, 1]
    assert plan.bundles == [{"CPU": 1.0, "GPU": 1.0}] * 4
    assert [a.bundle_index for a in plan.reservations["_"]] == [0, 1, 2, 3]
    assert all(a.num_gpus == 1.0 for a in plan.reservations["_"])


def test_shared_devices_get_fractional_reservations_from_the_placement():
    plan = plan_bundles(placements({"rollout": "0-1:0-5"}, [2])["rollout"], num_cpus=0.5)
    assert plan.bundles == [{"CPU": 1.5, "GPU": 1.0}, {"CPU": 1.5, "GPU": 1.0}]
    assert [a.bundle_index for a in plan.reservations["_"]] == [0, 0, 0, 1, 1, 1]
    # Ray counts resources in units of 1e-4: three thirds reserve 0.9999 of the device, never more.
    assert sum(a.num_gpus for a in plan.reservations["_"] if a.bundle_index == 0) == pytest.approx(
        1.0, abs=1e-3
    )


def test_multi_device_process_reserves_all_its_devices_and_a_cpu_each():
    plan = plan_bundles(placements({"actor": "0-7:0-1"}, [8])["actor"])
    assert plan.bundles == [{"CPU": 4.0, "GPU": 4.0}] * 2
    assert [(a.num_gpus, a.num_cpus) for a in plan.reservations["_"]] == [(4.0, 4.0), (4.0, 4.0)]


def test_default_cpus_follow_the_devices_and_nodes_they_share():
    """One CPU per device, split like the device; one CPU per node for whole-node processes."""
    found = placements({"actor,rollout": "0-1", "agent": {"node_group": "node", "placement": "0:0-155"}}, [2])
    plan = plan_layout(found)
    assert [row.num_cpus for row in plan.reservations["actor"]] == [0.5, 0.5]
    assert [row.num_cpus for row in plan.reservations["rollout"]] == [0.5, 0.5]
    assert {row.num_cpus for row in plan.reservations["agent"]} == {0.0064}  # 1/156, rounded down
    assert plan.per_node()[0]["CPU"] == pytest.approx(2 + 156 * 0.0064)
    explicit = plan_layout(found, num_cpus={"agent": 0.25, "actor": None, "rollout": 2})
    assert {row.num_cpus for row in explicit.reservations["agent"]} == {0.25}
    assert [row.num_cpus for row in explicit.reservations["actor"]] == [0.5, 0.5]
    assert [row.num_cpus for row in explicit.reservations["rollout"]] == [2, 2]


@pytest.mark.parametrize(
    ("share", "asked"),
    [(1.0, 1.0), (0.5, 0.5), (1 / 3, 0.3333), (1 / 7, 0.1428), (1.2, 1.0), (2.5, 2.0), (3 * (1 / 3), 1.0)],
)
def test_shares_are_rounded_down_to_what_ray_accepts(share, asked):
    """Ray takes fractions only below 1 and in steps of 1e-4: never ask more than the share."""
    assert reservable(share) == asked
    assert reservable(share) <= share + 1e-9


def test_a_process_owning_a_shared_and_a_whole_gpu_reserves_a_whole_one():
    """RLinf's reward_server: "0-1:0" beside four components on GPU 0 has 1/5 + 1 = 1.2 GPUs."""
    found = placements({"actor,env,rollout,reward": "0-0", "reward_server": "0-1:0"}, [2])
    plan = plan_layout(found)
    assert plan.bundles == [{"CPU": 1.8, "GPU": 2.0}]
    assert [row.num_gpus for row in plan.reservations["reward_server"]] == [1.0]
    assert [row.num_gpus for row in plan.reservations["actor"]] == [0.2]
    assert sum(row.num_gpus for rows in plan.reservations.values() for row in rows) <= 2.0


def test_node_processes_share_one_bundle_per_node_and_zero_cpu_stays_valid():
    found = placements({"env": {"node_group": "node", "placement": "0-1:0-4"}}, [0, 0])["env"]
    plan = plan_bundles(found, num_cpus=0)
    assert plan.bundle_nodes == [0, 1]
    assert plan.bundles == [{"CPU": MIN_BUNDLE_CPU}] * 2
    assert [a.bundle_index for a in plan.reservations["_"]] == [0, 0, 0, 1, 1]
    assert plan.per_node() == {0: {"CPU": MIN_BUNDLE_CPU}, 1: {"CPU": MIN_BUNDLE_CPU}}


def test_custom_hardware_is_reserved_only_where_ray_knows_it():
    groups = [
        {
            "label": "robots",
            "node_ranks": 0,
            "hardware": {
                "type": "robot",
                "configs": [{"node_rank": 0, "ip": "a"}, {"node_rank": 0, "ip": "b"}],
            },
        }
    ]
    found = placements({"env": {"node_group": "robots", "placement": "0-1"}}, [0], groups)["env"]
    without = plan_bundles(found)
    assert all("robot" not in bundle for bundle in without.bundles)
    with_ray_resource = plan_bundles(found, node_resources={0: {"robot": 2.0}})
    assert with_ray_resource.bundles == [{"CPU": 1.0, "robot": 1.0}] * 2
    assert with_ray_resource.reservations["_"][0].resources == {"robot": 1.0}


def test_resource_diff_names_each_mismatch():
    assert resource_diff({"GPU": 16}, {"GPU": 16.0, "CPU": 4}) == ""
    diff = resource_diff({"GPU": 16, "CPU": 4}, {"GPU": 8.0, "CPU": 4.0})
    assert "GPU: required 16, Ray has 8 (-8)" in diff
    assert "CPU" not in diff


@pytest.mark.parametrize("length", [0, 1, 7, 8, 9, 23])
def test_split_then_concat_round_trips_lists_and_arrays(length):
    items = list(range(length))
    chunks = split_batch(items, 4)
    assert len(chunks) == 4
    assert max(map(len, chunks)) - min(map(len, chunks)) <= 1
    assert concat_chunks(chunks) == items
    array = np.arange(length * 2).reshape(length, 2)
    assert np.array_equal(concat_chunks(split_batch(array, 3)), array)


def test_worker_group_error_message_names_group_ranks_nodes_and_keeps_results():
    error = WorkerGroupError(
        "rollout",
        "generate",
        {3: RankFailure(3, 1, "ValueError: bad prompt", "Traceback …\nValueError: bad prompt")},
        results={0: "a", 1: "b"},
        pending=[2],
    )
    text = str(error)
    assert "worker group 'rollout': generate failed on rank(s) 3" in text
    assert "rank 3 (node 1): ValueError: bad prompt" in text
    assert "Traceback" in text
    assert error.results == {0: "a", 1: "b"}
    assert error.pending == [2]
    assert error.failed_ranks == [3]


def test_one_deadline_and_poll_bound_every_wait() -> None:
    forever = Deadline.after(None)
    assert not forever.expired and forever.left() == float("inf")
    soon = Deadline.after(60.0).sooner(0.05)
    assert 0 < soon.left() <= 0.05 and soon.limit_s == 60.0
    answers = iter([None, None, "ready"])
    assert (
        poll(lambda: next(answers), Deadline.after(5.0), lambda: AssertionError("late"), every_s=0.01)
        == "ready"
    )
    started = time.monotonic()
    with pytest.raises(TimeoutError, match="nothing came"):
        poll(lambda: None, Deadline.after(0.1), lambda: TimeoutError("nothing came"), every_s=0.02)
    assert 0.1 <= time.monotonic() - started < 1.0
