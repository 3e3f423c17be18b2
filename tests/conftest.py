"""Fixtures shared by the test modules that run a real Ray.

A module that defines ``CFG`` (a full config with a ``cluster`` section, usually ``simulate``-d)
gets a Ray cluster for the whole module (``cluster``) and its ``ComponentPlacement``
(``placement``). Starting Ray costs seconds on two cores, so the Ray a module ran on is kept for
the next module whose cluster section asks for the same Ray (the same nodes, devices, CPUs,
resources and labels: ``node_groups`` and the other keys that only shape a ``Cluster`` may
differ) when it is as it was started: every node alive (a node a module killed is started again
under its rank), no placement group, every CPU and GPU free and no named actor left. Such a
module gets a ``Cluster`` of its own section on that Ray. Modules are run grouped by the Ray they
ask for (in order of first appearance; tests keep their order inside a module) so that such
neighbours exist. Any module that wants another Ray, or none (it may start its own, in-process
or in a subprocess), finds none running.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
import ray
from omegaconf import OmegaConf

from rlinfra import Cluster, ComponentPlacement

# The Ray asked for (see _ray_key) -> the cluster that started it, and the section it was made from.
_kept: dict[str, tuple[Cluster, dict[str, Any] | None]] = {}

# The cluster keys that decide which Ray is started (see ``Cluster``); the others only shape the
# ``Cluster`` object made on it (node groups, their env, hardware) and can differ between modules.
_RAY_KEYS = (
    "address",
    "num_nodes",
    "simulate",
    "simulate_cpus",
    "simulate_labels",
    "simulate_object_store_mib",
    "simulate_resources",
)


def _cluster_section(module: Any) -> dict[str, Any] | None:
    """The module's cluster section, ``component_placement`` aside (a ``Cluster`` ignores it)."""
    cfg = getattr(module, "CFG", None)
    if cfg is None:
        return None
    section = OmegaConf.to_container(OmegaConf.create(dict(cfg))["cluster"], resolve=True)
    assert isinstance(section, dict)
    return {str(key): value for key, value in section.items() if key != "component_placement"}


def _ray_key(module: Any) -> str | None:
    section = _cluster_section(module)
    if section is None:
        return None
    return json.dumps({k: v for k, v in section.items() if k in _RAY_KEYS}, sort_keys=True, default=str)


def _shut_down_kept() -> None:
    for live, _ in _kept.values():
        live.shutdown()
    _kept.clear()


def _restart_lost_nodes(live: Cluster) -> bool:
    """A module that rehearsed node loss leaves its simulated nodes started again (under their
    ranks, see ``Cluster.restart_node``), so the next module can have this Ray as it was started.
    False when a node could not be restarted (the Ray is then not kept)."""
    if live.embedded is None:
        return True
    try:
        for rank in sorted(live.dead_node_ranks() - {0}):  # the head is never restarted
            live.restart_node(rank)
    except Exception as error:  # a fresh Ray for the next module instead
        print(f"\nconftest: a lost node could not be restarted ({error}); the next module starts Ray")
        return False
    return True


def _as_started(live: Cluster, settle_s: float = 10.0) -> bool:
    """Every node alive, nothing reserved, held or named: what a fresh cluster would be. Ray frees
    resources asynchronously, so this waits up to ``settle_s`` for them."""
    if live.dead_node_ranks():
        return False
    deadline = time.monotonic() + settle_s
    while True:
        total, free = ray.cluster_resources(), ray.available_resources()
        held = any(total[key] - free.get(key, 0.0) > 1e-6 for key in ("CPU", "GPU") if key in total)
        groups = [g for g, info in ray.util.placement_group_table().items() if info["state"] != "REMOVED"]
        named = ray.util.list_named_actors(all_namespaces=True)
        if not (held or groups or named):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Run modules that ask for the same cluster one after another (see the module docstring)."""
    group_of: dict[str, int] = {}
    order: list[tuple[int, int]] = []
    for index, item in enumerate(items):
        module = getattr(item, "module", None)
        key = _ray_key(module) if module is not None else None
        name = key if key is not None else f"module:{item.nodeid.split('::')[0]}"
        order.append((group_of.setdefault(name, len(group_of)), index))
    ranked = sorted(range(len(items)), key=lambda i: order[i])
    items[:] = [items[i] for i in ranked]


_final_status: list[int] = []  # the run's exit status, once every result is reported


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    _final_status.append(int(exitstatus))


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    """Leave without the interpreter's own finalisation. Once in a clean-clone run the process
    took a SIGSEGV there, after every test had passed, the summary was printed and Ray had been
    shut down (native threads of Ray or torch torn down in the wrong order); ``make test`` then
    failed on a run with nothing wrong in it. Everything is reported and written by now, so the
    exit status is the run's own."""
    if _final_status:
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(_final_status[-1])


@pytest.fixture(scope="session", autouse=True)
def _kept_clusters_end_with_the_session() -> Iterator[None]:
    yield
    _shut_down_kept()


@pytest.fixture(scope="module", autouse=True)
def _no_foreign_cluster(request: pytest.FixtureRequest) -> None:
    """A kept cluster another module asked for is stopped before this module's first test."""
    if _ray_key(request.module) not in _kept:
        _shut_down_kept()


@pytest.fixture(scope="module")
def cluster(request: pytest.FixtureRequest) -> Iterator[Cluster]:
    key = _ray_key(request.module)
    assert key is not None, "a module using the cluster fixture defines CFG"
    section = request.module.CFG["cluster"]
    wanted = _cluster_section(request.module)
    started, started_from = _kept.pop(key, (None, None))
    if started is None:
        _shut_down_kept()
        started, started_from = Cluster(cluster_cfg=section), wanted
    try:
        # Another section on the same Ray: a Cluster of its own (it attaches, and stops nothing).
        yield started if wanted == started_from else Cluster(cluster_cfg=section)
    finally:
        if _restart_lost_nodes(started) and _as_started(started):
            _kept[key] = (started, started_from)
        else:
            started.shutdown()


@pytest.fixture(scope="module")
def placement(request: pytest.FixtureRequest, cluster: Cluster) -> ComponentPlacement:
    return ComponentPlacement(request.module.CFG, cluster)
