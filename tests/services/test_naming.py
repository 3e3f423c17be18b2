"""The naming service on a private one-node Ray: atomic claims, eager TTLs, watches, registrations
that survive a restart, and service lifetimes across drivers (detached or not)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
import ray

from rlinfra import Cluster
from rlinfra.runtime.deadline import Deadline
from rlinfra.services.naming import Change, NamingError, NamingService

pytestmark = pytest.mark.timeout(120)

ENGINE = "10.0.0.7:30000"


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    started = Cluster(cluster_cfg={"num_nodes": 1})
    yield started
    started.shutdown()


@pytest.fixture
def kv(cluster: Cluster) -> Iterator[NamingService]:
    """A fresh service per test (unique name), destroyed afterwards."""
    client = NamingService.connect(name=f"naming-{uuid.uuid4().hex[:8]}")
    yield client
    client.destroy()


def collect(kv: NamingService, prefix: str, since: int, until, timeout_s: float = 30.0) -> list[Change]:
    """Follow ``watch`` from ``since`` until ``until(changes so far)`` holds; fail at the deadline."""
    deadline = time.monotonic() + timeout_s
    seen: list[Change] = []
    while not until(seen):
        remaining = deadline - time.monotonic()
        assert remaining > 0, f"watch({prefix!r}) saw only {seen}"
        since, changes = kv.watch(prefix, since_version=since, timeout_s=remaining)
        seen.extend(changes)
    return seen


def run_driver(script: str, *args: str) -> str:
    """Run ``script`` as a separate Ray driver of this test's cluster; returns its stdout."""
    env = {key: value for key, value in os.environ.items() if key != "RAY_ADDRESS"}
    result = subprocess.run(
        [sys.executable, "-c", script, ray.get_runtime_context().gcs_address, *args],
        capture_output=True,
        text=True,
        timeout=90,
        env=env,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


DRIVER = """
import sys
import ray
from rlinfra.services.naming import NamingService
ray.init(address=sys.argv[1], namespace="rlinfra", logging_level="warning")
kv = NamingService.connect(name=sys.argv[2], detached=sys.argv[3] == "detached")
kv.put("engine/0", "10.0.0.7:30000")
print("published")
"""


def test_basic_operations(kv: NamingService) -> None:
    first = kv.put("engine/0", ENGINE)
    second = kv.put("engine/1", "10.0.0.8:30000")
    kv.put("router", {"port": 8000})
    assert second > first
    assert kv.get("engine/0") == ENGINE
    assert kv.get("engine/9") is None and kv.get("engine/9", default="none") == "none"
    assert kv.list("engine/") == {"engine/0": ENGINE, "engine/1": "10.0.0.8:30000"}
    assert kv.list() == {**kv.list("engine/"), "router": {"port": 8000}}
    assert kv.delete("engine/1") is True
    assert kv.delete("engine/1") is False
    assert NamingService.lookup(kv.name).list("engine/") == {"engine/0": ENGINE}
    current, snapshot = kv.watch("engine/", since_version=0, timeout_s=10)  # 0: state, at once
    assert snapshot == [Change("engine/0", "snapshot", ENGINE, first)] and current > second
    with pytest.raises(ValueError, match="None means 'absent'"):
        kv.put("engine/0", None)
    with pytest.raises(ValueError, match="ttl_s must be positive"):
        kv.put("engine/0", ENGINE, ttl_s=0)


def test_compare_and_set(kv: NamingService) -> None:
    assert kv.compare_and_set("epoch", None, 1) is True  # None: only if absent
    assert kv.compare_and_set("epoch", None, 2) is False
    assert kv.compare_and_set("epoch", 7, 2) is False
    assert kv.compare_and_set("epoch", 1, 2) is True
    assert kv.get("epoch") == 2
    assert kv.put_if_absent("epoch", 9) is False and kv.get("epoch") == 2


@ray.remote(num_cpus=0.25)
def contend(name: str, go_version: int, claimants: int, increments: int, tag: str) -> list[tuple[str, bool]]:
    """One process of racing claimants: wait for the start signal, then each thread claims the
    leader key once and increments the shared counter with compare_and_set."""
    kv = NamingService.lookup(name)
    kv.watch("race/go", since_version=go_version, timeout_s=60)

    def claimant(index: int) -> tuple[str, bool]:
        me = f"{tag}-{index}"
        won = kv.put_if_absent("race/leader", me)
        for _ in range(increments):
            while True:
                current = kv.get("race/counter")
                if kv.compare_and_set("race/counter", current, (current or 0) + 1):
                    break
        return me, won

    with ThreadPoolExecutor(claimants) as pool:
        return list(pool.map(claimant, range(claimants)))


def test_exactly_one_of_many_racing_claimants_wins_and_no_increment_is_lost(kv: NamingService) -> None:
    go_version = kv.put("race/ready", True)
    runs = [contend.remote(kv.name, go_version, 4, 5, f"p{process}") for process in range(4)]
    kv.put("race/go", True)  # the barrier: every process waits on watch("race/go")
    outcomes = [outcome for run in ray.get(runs, timeout=90) for outcome in run]
    winners = [me for me, won in outcomes if won]
    assert len(outcomes) == 16
    assert len(winners) == 1
    assert kv.get("race/leader") == winners[0]
    assert kv.get("race/counter") == 16 * 5


def test_ttl_expires_eagerly_without_any_read(kv: NamingService) -> None:
    kv.put("keep", "forever")
    started = time.monotonic()
    version = kv.put("engine/0", ENGINE, ttl_s=0.3)
    _, changes = kv.watch("engine/", since_version=version, timeout_s=10)
    elapsed = time.monotonic() - started
    assert changes == [Change("engine/0", "expire", ENGINE, version + 1)]
    assert 0.3 <= elapsed < 0.3 + 0.5
    assert kv.list() == {"keep": "forever"}


def test_watch_returns_on_a_change_under_its_prefix_and_otherwise_at_the_timeout(kv: NamingService) -> None:
    since = kv.put("unrelated", 0)
    result: list[tuple[int, list[Change]]] = []
    watcher = threading.Thread(target=lambda: result.append(kv.watch("engine/", since, timeout_s=30)))
    watcher.start()
    kv.put("other/0", 1)  # not under the prefix: must not end the watch
    started = time.monotonic()
    version = kv.put("engine/0", ENGINE)
    watcher.join(timeout=20)
    assert not watcher.is_alive() and time.monotonic() - started < 10
    assert result == [(version, [Change("engine/0", "put", ENGINE, version)])]

    started = time.monotonic()
    quiet_version, quiet = kv.watch("engine/", timeout_s=0.3)  # since_version=None: from now on
    assert quiet == [] and quiet_version == version
    assert 0.3 <= time.monotonic() - started < 5


def test_a_registered_key_is_kept_alive_and_withdrawn_at_the_end_of_its_block(kv: NamingService) -> None:
    since = kv.put("marker", 0)
    with kv.registered("svc/engine-0", ENGINE, ttl_s=0.6) as held:
        version, changes = kv.watch("svc/", since_version=since, timeout_s=10)
        assert [(c.key, c.kind) for c in changes] == [("svc/engine-0", "put")]
        _, changes = kv.watch("svc/", since_version=version, timeout_s=1.5)  # 2.5 TTLs: kept alive
        assert changes == []  # refreshes move the deadline only: watchers are not woken
        assert kv.get("svc/engine-0") == ENGINE and held.error is None
        rival = NamingService.lookup(kv.name).registered("svc/engine-0", "10.0.0.8:1", ttl_s=1)
        with pytest.raises(NamingError, match=r"register\('svc/engine-0'\): held by another"), rival:
            pass
    assert kv.list("svc/") == {}
    since = kv.put("marker", 1)
    with kv.registered("svc/engine-0", ENGINE, ttl_s=0.6):
        pass
    _, changes = kv.watch("svc/", since_version=since, timeout_s=1)
    assert [(c.key, c.kind) for c in changes] == [("svc/engine-0", "put"), ("svc/engine-0", "delete")]


def test_a_stopped_holder_expires_and_a_key_taken_meanwhile_is_not_taken_back(kv: NamingService) -> None:
    since = kv.put("marker", 0)
    with kv.registered("svc/leader", "engine-0", ttl_s=0.6) as held:
        held.stop.set()  # the process pauses: no more refreshes
        paused_at = time.monotonic()
        expired = collect(kv, "svc/", since, until=lambda seen: any(c.kind == "expire" for c in seen))
        assert time.monotonic() - paused_at < 0.6 + 0.5
        assert expired[-1] == Change("svc/leader", "expire", "engine-0", expired[-1].version)
        assert kv.put_if_absent("svc/leader", "engine-1")  # someone else takes it meanwhile
    assert kv.get("svc/leader") == "engine-1"  # the end of the block withdrew nothing of theirs

    kv.put("svc/leader", "engine-0", ttl_s=5)
    with kv.registered("svc/leader", "engine-0", ttl_s=0.6) as held:  # re-registers an own key
        kv.put("svc/leader", "engine-2")  # overwritten by another
        deadline = Deadline.after(10)
        while held.error is None and not deadline.expired:
            time.sleep(0.02)
        assert isinstance(held.error, NamingError) and "taken by another holder" in str(held.error)
    assert kv.get("svc/leader") == "engine-2"


def test_a_restarted_service_gets_the_registered_keys_back(kv: NamingService) -> None:
    with kv.registered("engine/0", ENGINE, ttl_s=1.5) as held:
        since = kv.put("config", "lost in the restart")
        ray.kill(ray.get_actor(kv.name, namespace=kv.namespace), no_restart=False)  # a crash

        deadline = time.monotonic() + 60
        restored: list[Change] = []
        while not restored:
            assert time.monotonic() < deadline, "the keeper never re-registered engine/0"
            try:
                since, changes = kv.watch("engine/", since_version=since, timeout_s=5)
            except NamingError as err:  # the store died under the watch: expected once
                assert "died or is unreachable" in str(err)
                continue
            restored = [change for change in changes if change.key == "engine/0"]
        assert restored[0].kind in ("put", "snapshot")
        assert kv.list() == {"engine/0": ENGINE}
        assert held.restored == 1


def test_every_failure_is_a_naming_error_that_names_the_service_and_the_operation(
    kv: NamingService,
) -> None:
    with pytest.raises(NamingError, match=rf"{kv.name}.*watch\('slow/'\): no reply within 0.2 s"):
        kv._call("watch('slow/')", "watch", "slow/", None, 5.0, timeout_s=0.2)
    with pytest.raises(NamingError, match=r"naming service 'absent-service' .* lookup: no such service"):
        NamingService.lookup("absent-service")

    other = NamingService.lookup(kv.name)
    with other.registered("engine/0", ENGINE, ttl_s=0.3) as held:
        kv.destroy()
        deadline = Deadline.after(10)
        while held.error is None and not deadline.expired:
            time.sleep(0.02)
        assert isinstance(held.error, NamingError) and kv.name in str(held.error)
    with pytest.raises(NamingError, match=rf"'{kv.name}'.*put\('k'\)"):
        other.put("k", 1)
    with pytest.raises(NamingError, match="destroyed"):
        kv.get("k")


def test_a_detached_service_outlives_its_driver_until_destroyed(cluster: Cluster) -> None:
    name = f"naming-detached-{uuid.uuid4().hex[:8]}"
    assert "published" in run_driver(DRIVER, name, "detached")
    found = NamingService.lookup(name)
    assert found.get("engine/0") == ENGINE
    found.destroy()
    with pytest.raises(NamingError, match="no such service"):
        NamingService.lookup(name)


def test_a_non_detached_service_dies_with_its_driver(cluster: Cluster) -> None:
    name = f"naming-owned-{uuid.uuid4().hex[:8]}"
    assert "published" in run_driver(DRIVER, name, "owned")
    deadline = time.monotonic() + 30
    while True:
        try:
            NamingService.lookup(name, timeout_s=2)
        except NamingError as err:
            assert "no such service" in str(err) or "died" in str(err)
            break
        assert time.monotonic() < deadline, "the service outlived its driver"
        time.sleep(0.1)
