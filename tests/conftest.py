"""Markers and fixtures shared by the test modules.

``ray`` (``pytest -m "not ray"``: every test that starts no Ray, in seconds). A test carries it when
it starts Ray, in this process or in another one:

- automatically, when it uses a fixture named ``cluster`` or ``placement`` (the ones below, or a
  module's own of that name: in this suite those start Ray), or one its module names in
  ``pytest.mark.ray_fixtures(...)``, directly or through other fixtures (an argument
  ``parametrize`` gives a value, such as a ``cluster`` section, is no fixture);
- from its module's ``pytestmark = pytest.mark.ray`` when a test of the module starts Ray some
  other way (``ray.init``, ``Cluster(...)``, a subprocess running ``rlinfra run`` or ``ray start``).

The marker is checked: a test without it must leave no Ray behind that it did not find, and must
start none in this process. It is an error at its teardown if Ray is initialised in this process
and was not before, if this process started a Ray session (a ``session_*_<pid>`` folder in Ray's
temp dir), or if a ``gcs_server`` or ``raylet`` below this process is new (raylets only when Ray
was not up before: a module's cluster may start a lost node again while it is torn down). A Ray
a subprocess started and stopped within the test leaves no trace that is checked.

``slow`` tests (minutes) are left out unless ``-m`` names ``slow`` (``pytest -m slow``), also under
``-m "not ray"`` or ``-m ray`` (an ``-m 'not slow'`` in ``addopts`` is replaced by any ``-m`` given).

``cluster(CFG)``: a module whose tests share one Ray declares it with ``pytestmark =
pytest.mark.cluster(CFG)``, ``CFG`` a full config with a ``cluster`` section (usually
``simulate``-d). It gets a Ray cluster for the whole module (``cluster``) and its
``ComponentPlacement`` (``placement``); its tests that use neither carry no ``ray`` marker and
must start no Ray. Starting Ray costs seconds on two cores, so the Ray a
module ran on is kept for the next module whose cluster section asks for the same Ray (the same
nodes, devices, CPUs, resources and labels: ``node_groups`` and the other keys that only shape a
``Cluster`` may differ) when it is as it was started: every node alive (a node a module killed is
started again under its rank), no placement group, every CPU and GPU free and no named actor
left. Such a module gets a ``Cluster`` of its own section on that Ray. Modules are run grouped by
the Ray they declare (in order of first appearance; tests keep their order inside a module) so
that such neighbours exist. Any module that declares another Ray, or none (it may start its own,
in-process or in a subprocess), finds none running.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import ray
from omegaconf import OmegaConf

from rlinfra import Cluster, ComponentPlacement
from tests.listeners import descendants

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

# Fixtures that start Ray wherever they are defined (see the module docstring).
_RAY_FIXTURES = frozenset({"cluster", "placement"})

# --- the cluster a module declares ---------------------------------------------------------------


def _module_of(node: pytest.Item | pytest.Collector) -> pytest.Module | None:
    return node if isinstance(node, pytest.Module) else node.getparent(pytest.Module)


def _declared_cfg(node: pytest.Item | pytest.Collector) -> Any | None:
    """The config of the module's ``pytest.mark.cluster(CFG)``, or None."""
    module = _module_of(node)
    marks = [] if module is None else [mark for mark in module.own_markers if mark.name == "cluster"]
    if not marks:
        return None
    mark = marks[-1]
    if len(marks) > 1 or len(mark.args) != 1 or mark.kwargs or "cluster" not in mark.args[0]:
        raise pytest.UsageError(
            f"{module.nodeid}: declare one cluster, pytestmark = pytest.mark.cluster(CFG), CFG a config"
            " with a 'cluster' section"
        )
    return mark.args[0]


def _cluster_section(cfg: Any) -> dict[str, Any]:
    """The declared cluster section, ``component_placement`` aside (a ``Cluster`` ignores it)."""
    section = OmegaConf.to_container(OmegaConf.create(dict(cfg))["cluster"], resolve=True)
    assert isinstance(section, dict)
    return {str(key): value for key, value in section.items() if key != "component_placement"}


_keys: dict[str, str | None] = {}  # module node id -> its Ray key (see _ray_key)


def _ray_key(node: pytest.Item | pytest.Collector) -> str | None:
    """Which Ray the module declares (the ``_RAY_KEYS`` of its section), None if none."""
    module = _module_of(node)
    if module is None:
        return None
    if module.nodeid not in _keys:
        cfg = _declared_cfg(module)
        section = None if cfg is None else _cluster_section(cfg)
        _keys[module.nodeid] = (
            None
            if section is None
            else json.dumps({k: v for k, v in section.items() if k in _RAY_KEYS}, sort_keys=True, default=str)
        )
    return _keys[module.nodeid]


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


# --- selection: slow, ray, and the order of modules ------------------------------------------------


def _parametrized_directly(item: pytest.Item) -> set[str]:
    """The test's arguments that ``parametrize`` gives values (they hide fixtures of that name)."""
    names: set[str] = set()
    for mark in item.iter_markers("parametrize"):
        argnames = mark.args[0] if mark.args else mark.kwargs.get("argnames", ())
        if isinstance(argnames, str):
            argnames = [name.strip() for name in argnames.split(",")]
        indirect = mark.kwargs.get("indirect", False)
        if indirect is not True:
            names |= set(argnames) - set(indirect or ())
    return names


def _starts_ray(item: pytest.Item) -> bool:
    named = {str(name) for mark in item.iter_markers("ray_fixtures") for name in mark.args}
    used = set(getattr(item, "fixturenames", ())) - _parametrized_directly(item)
    return bool((_RAY_FIXTURES | named) & used)


def _check_cluster_marks(item: pytest.Item) -> None:
    module = _module_of(item)
    for node in item.listchain():
        if node is not module and any(mark.name == "cluster" for mark in node.own_markers):
            raise pytest.UsageError(
                f"{node.nodeid}: pytest.mark.cluster is declared by a module, in pytestmark"
            )


@pytest.hookimpl(tryfirst=True)  # before pytest's -m deselects by the markers added here
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Leave out slow tests unless ``-m`` names them, mark the tests that start Ray, and run
    modules that ask for the same cluster one after another (see the module docstring)."""
    if not re.search(r"\bslow\b", config.getoption("markexpr", "") or ""):
        slow = [item for item in items if item.get_closest_marker("slow") is not None]
        if slow:
            config.hook.pytest_deselected(items=slow)
            items[:] = [item for item in items if item.get_closest_marker("slow") is None]
    group_of: dict[str, int] = {}
    order: list[tuple[int, int]] = []
    for index, item in enumerate(items):
        _check_cluster_marks(item)
        if item.get_closest_marker("ray") is None and _starts_ray(item):
            item.add_marker(pytest.mark.ray)
        key = _ray_key(item)
        name = key if key is not None else f"module:{item.nodeid.split('::')[0]}"
        order.append((group_of.setdefault(name, len(group_of)), index))
    ranked = sorted(range(len(items)), key=lambda i: order[i])
    items[:] = [items[i] for i in ranked]


# --- the check that a test without the ray marker starts no Ray -----------------------------------

_RAY_DAEMONS = ("gcs_server", "raylet")

try:  # where Ray puts its sessions: RAY_TMPDIR, else TMPDIR on Linux, else /tmp; plus "ray"
    from ray._common.utils import get_default_ray_temp_dir as _ray_temp_dir
except ImportError:  # another Ray's layout

    def _ray_temp_dir() -> str:
        return os.path.join(os.environ.get("RAY_TMPDIR") or os.environ.get("TMPDIR") or "/tmp", "ray")


def _read(path: str) -> str | None:
    try:
        with open(path) as file:
            return file.read()
    except OSError:  # gone meanwhile, or not Linux
        return None


@dataclass(frozen=True)
class _RaySeen:
    initialized: bool
    daemons: dict[int, str]  # pid -> gcs_server or raylet, below this process
    sessions: frozenset[str]  # Ray sessions this process started (named after its pid)

    @classmethod
    def now(cls) -> _RaySeen:
        daemons = {}
        for pid in descendants(os.getpid()) - {os.getpid()}:
            name = (_read(f"/proc/{pid}/comm") or "").strip()
            if name in _RAY_DAEMONS:
                daemons[pid] = name
        try:
            entries = os.listdir(_ray_temp_dir())
        except OSError:
            entries = []
        suffix = f"_{os.getpid()}"
        sessions = frozenset(e for e in entries if e.startswith("session_") and e.endswith(suffix))
        return cls(ray.is_initialized(), daemons, sessions)

    def started_since(self, before: _RaySeen) -> list[str]:
        """What of Ray was started since ``before``, in words."""
        found = []
        if self.initialized and not before.initialized:
            found.append("Ray is initialised in the pytest process")
        found += [
            f"a Ray session of the pytest process: {name}" for name in sorted(self.sessions - before.sessions)
        ]
        for pid, name in sorted(self.daemons.items()):
            if pid not in before.daemons and (name == "gcs_server" or not before.initialized):
                found.append(f"a {name} process below the pytest process (pid {pid})")
        return found


_seen_before = pytest.StashKey[_RaySeen]()


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    if item.get_closest_marker("ray") is None:
        item.stash[_seen_before] = _RaySeen.now()  # before any fixture of the test is set up
    return (yield)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_teardown(item: pytest.Item) -> Iterator[None]:
    result = yield  # a teardown that failed is reported as it is, unchecked
    before = item.stash.get(_seen_before, None)
    if before is not None:  # after every fixture torn down at this test
        started = _RaySeen.now().started_since(before)
        if started:
            if ray.is_initialized() and not before.initialized:
                ray.shutdown()  # the next tests find no Ray, as they would have
            pytest.fail(
                "this test started Ray but has no `ray` marker (see tests/conftest.py): "
                + "; ".join(started),
                pytrace=False,
            )
    return result


# --- the exit ----------------------------------------------------------------------------------------

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


# --- fixtures ------------------------------------------------------------------------------------------


@pytest.fixture(scope="session", autouse=True)
def _kept_clusters_end_with_the_session() -> Iterator[None]:
    yield
    _shut_down_kept()


@pytest.fixture(scope="module", autouse=True)
def _no_foreign_cluster(request: pytest.FixtureRequest) -> None:
    """A kept cluster another module asked for is stopped before this module's first test."""
    if _ray_key(request.node) not in _kept:
        _shut_down_kept()


@pytest.fixture(scope="module")
def cluster(request: pytest.FixtureRequest) -> Iterator[Cluster]:
    cfg = _declared_cfg(request.node)
    assert cfg is not None, (
        "a module using the cluster fixture declares pytestmark = pytest.mark.cluster(CFG)"
    )
    key = _ray_key(request.node)
    assert key is not None
    section = cfg["cluster"]
    wanted = _cluster_section(cfg)
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
    cfg = _declared_cfg(request.node)
    assert cfg is not None
    return ComponentPlacement(cfg, cluster)
