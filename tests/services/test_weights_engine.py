"""Engine-style receivers on real Ray actors: a version staged on the host, loaded into the
engine's own torch parameters during the pause, checked by hashing those parameters against the
host copy, rolled back by loading the previous host copy; the engine's caches never outlive a swap."""

from __future__ import annotations

import os
import threading

import pytest
import torch

from rlinfra import Worker, WorkerGroupError
from rlinfra.services.weights import WeightSender, WeightSync, WeightSyncError
from rlinfra.services.weights.engine import EngineReceiver

CFG = {
    "cluster": {"num_nodes": 1, "simulate": "1x4", "component_placement": {"trainer": "0", "engine": "1-3"}}
}
pytestmark = [pytest.mark.timeout(240), pytest.mark.cluster(CFG)]
BUCKET_BYTES = 8 * 1024
MIB = 2**20


def make_model(version: int, width: int = 64, layers: int = 1) -> torch.nn.Module:
    """The same architecture at every version; every parameter equal to ``version`` (+ offsets)."""
    hidden = [torch.nn.Linear(width, width) for _ in range(layers)]
    model = torch.nn.Sequential(*hidden, torch.nn.Linear(width, 8))
    with torch.no_grad():
        for index, parameter in enumerate(model.parameters()):
            parameter.fill_(version + index / 10)
    return model


def fingerprint(model: torch.nn.Module) -> list[float]:
    return [round(float(p.detach().double().sum()), 3) for p in model.parameters()]


class Trainer(WeightSender, Worker):
    def __init__(self, width: int = 64, layers: int = 1) -> None:
        self.width, self.layers = width, layers
        self.model = make_model(0, width, layers)

    def weights_state(self):
        return self.model.state_dict()

    def train_to(self, version: int) -> None:
        self.model = make_model(version, self.width, self.layers)


class Engine(EngineReceiver, Worker):
    """A toy engine: a torch model it serves from, and a prefix cache of outputs per prompt (what
    a KV or prefix cache is to a real engine: state computed with the weights of the moment)."""

    def __init__(self, width: int = 64, layers: int = 1, flip_rank: int = -1) -> None:
        self.width = width
        self.model = make_model(0, width, layers)
        self.cache: dict[float, tuple[int, float]] = {}
        self.flip_next = False
        self.peak_anon = 0
        if self.incarnation == 0:  # a replaced engine waits for admission
            self.set_initial_weights(version=0)

    def engine_state(self):
        return self.model.state_dict()

    def load_weights(self, named_tensors) -> None:
        super().load_weights(named_tensors)
        if self.flip_next:
            self.flip_next = False
            with torch.no_grad():  # a load that went wrong: one bit of the engine's weights flipped
                self.model[0].weight.view(torch.int32)[0, 0] ^= 1

    def flip_next_load(self) -> None:
        self.flip_next = True

    def weights_loaded(self, version: int) -> None:
        self.cache.clear()

    def generate(self, prompt: float) -> tuple[int, float, bool]:
        """(version, output, whether it came from the cache) — computed at most once per version."""
        with self.serving(timeout_s=10) as weights:
            hit = prompt in self.cache
            if not hit:
                with torch.no_grad():
                    output = float(self.model(torch.full((1, self.width), prompt)).sum())
                self.cache[prompt] = (weights.version, output)
            cached_version, output = self.cache[prompt]
            assert cached_version == weights.version
            return weights.version, output, hit

    def holds(self) -> tuple[int, list[float]]:
        with self.serving(timeout_s=10) as weights:
            return weights.version, fingerprint(self.model)

    def die(self) -> None:
        os._exit(7)

    def watch_memory(self) -> int:
        """Start sampling this process's private memory (RssAnon) every millisecond; returns it now."""
        self.peak_anon = anon_bytes()
        stop = self._stop_watch = threading.Event()

        def sample() -> None:
            while not stop.wait(0.001):
                self.peak_anon = max(self.peak_anon, anon_bytes())

        threading.Thread(target=sample, daemon=True).start()
        return self.peak_anon

    def memory_peak(self) -> int:
        self._stop_watch.set()
        return self.peak_anon


def anon_bytes() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no RssAnon in /proc/self/status")


@pytest.fixture(scope="module")
def launch(cluster, placement):
    groups = []

    def start(width: int = 64, layers: int = 1):
        while groups:  # the devices are the simulated node's: one pair at a time
            groups.pop().shutdown()
        trainer = Trainer.create_group(width, layers).launch(
            cluster, placement.get_strategy("trainer"), name="trainer"
        )
        engine = Engine.create_group(width, layers).launch(
            cluster, placement.get_strategy("engine"), name="engine", max_concurrency=3
        )
        groups.extend([trainer, engine])
        return trainer, engine, WeightSync(trainer, engine, bucket_bytes=BUCKET_BYTES, step_timeout_s=60)

    yield start
    while groups:
        groups.pop().shutdown()


@pytest.fixture(scope="module")
def pair(launch):
    """One trainer and three engines for the tests below (launching costs seconds): each test
    updates to versions above the ones before (``next_version``)."""
    return launch()


def next_version(sync) -> int:
    return sync.version + 1


def update(trainer, sync, version: int):
    trainer.train_to(version).wait()
    return sync.update(version)


def expect_holding(engine, version: int, width: int = 64, layers: int = 1) -> None:
    assert engine.holds().wait(timeout=30) == [(version, fingerprint(make_model(version, width, layers)))] * 3


def test_an_update_lands_in_the_engines_own_parameters_and_is_verified_there(pair):
    trainer, engine, sync = pair
    expect_holding(engine, sync.version)
    version = next_version(sync)
    report = update(trainer, sync, version)
    assert report.buckets >= 2
    expect_holding(engine, version)
    assert engine.weights_changed().wait(timeout=30) == [[]] * 3  # the engine's bytes hash as verified
    update(trainer, sync, version + 1)  # the staging memory of the version before is reused
    expect_holding(engine, version + 1)


def test_a_bit_flipped_in_the_engine_after_load_fails_verify_and_everyone_stays_on_the_old_version(pair):
    trainer, engine, sync = pair
    serving = sync.version
    engine.execute_on(2).flip_next_load().wait(timeout=30)
    with pytest.raises(WeightSyncError) as caught:
        update(trainer, sync, serving + 1)
    assert caught.value.step == "verify" and caught.value.failed_ranks == [2]
    assert "checksum mismatch in bucket(s) [0]" in str(caught.value)
    assert sync.version == serving
    expect_holding(engine, serving)  # rank 2's engine reloaded from its host copy: exactly the old bytes
    update(trainer, sync, serving + 2)  # the rejected bytes' memory is staging memory again
    expect_holding(engine, serving + 2)


def test_no_cache_survives_a_swap_into_the_next_versions_generation(pair):
    trainer, engine, sync = pair
    serving, one = sync.version, engine.execute_on(0)
    first = one.generate(0.5).wait(timeout=30)[0]
    again = one.generate(0.5).wait(timeout=30)[0]
    assert first[0] == serving and not first[2] and again == (serving, first[1], True)  # a cache hit
    update(trainer, sync, serving + 1)
    after = one.generate(0.5).wait(timeout=30)[0]
    assert after[0] == serving + 1 and not after[2], "the old version's cache must be dropped by the swap"
    assert after[1] != first[1]


def test_engine_receivers_refuse_a_transport_that_cannot_stage_on_the_host(pair):
    trainer, engine, sync = pair
    serving = sync.version
    shared = WeightSync(trainer, engine, transport="object_store_shared", initial_version=serving)
    with pytest.raises(WeightSyncError) as caught:
        update(trainer, shared, serving + 1)
    assert caught.value.step == "prepare"
    assert "engine:0 is an engine receiver" in str(caught.value)
    assert "use transport='object_store' or 'broadcast'" in str(caught.value)
    trainer.train_to(serving).wait()
    expect_holding(engine, serving)


def test_a_replaced_engine_is_admitted_into_its_own_parameters(pair):
    trainer, engine, sync = pair  # the last test of the pair: it kills an engine
    serving = sync.version
    with pytest.raises(WorkerGroupError):
        engine.execute_on(1).die().wait(timeout=30)
    assert engine.gone_ranks() == [1]
    engine.replace(1)
    sync.alive[:] = [0, 2]  # what the supervisor's Link learns from the failed call
    assert sync.admit([1]) == serving
    expect_holding(engine, serving)
    update(trainer, sync, serving + 1)
    expect_holding(engine, serving + 1)


def test_updates_add_one_host_copy_to_what_an_engine_receiver_starts_with(launch):
    width, layers = 1024, 4  # 4 hidden layers of 4 MiB: 16 MiB of float32 parameters
    trainer, engine, sync = launch(width, layers)  # after the pair's tests: it stops their groups
    model = make_model(0, width, layers)
    model_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    before = engine.execute_on(0).watch_memory().wait(timeout=30)[0]
    for version in (1, 2, 3):
        update(trainer, sync, version)
    peak = engine.execute_on(0).memory_peak().wait(timeout=30)[0]
    expect_holding(engine, 3, width, layers)
    # the receiver starts with the engine and the serving version's host copy; updates add the
    # staging copy, and from the third on each reuses the memory of the one before last
    extra = (peak - before) / model_bytes
    assert 0.9 < extra < 1.5, f"peak private memory beyond the engine: {extra:.2f} model copies"
