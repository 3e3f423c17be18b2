"""Time-sharing: a colocated trainer and engine taking turns on the same (simulated) devices.

The job: ``trainer,engine: 0-{R-1}`` on one simulated node. Each trainer rank holds N MiB of
parameters plus Adam's two moments (3N MiB); each engine rank holds its weights (N MiB) and a KV
cache (``--kv-mib``). Under ``rlinfra.runtime.timesharing.TimeSharing`` the driver switches
``--switches`` times (wake trainer → a train step → wake engine → a generation step …). A sleeping
component frees its buffers and a waking one allocates and fills them again: on the CPU, that
stands in for the offload to and onload from host memory. Baselines, measured in the same run:

* switch time: the same memory work done inside one process, without any orchestration — a plain
  worker per rank (on devices of its own) frees the trainer's buffers, gives them back to the OS
  the way a sleeping worker does, and allocates and fills the engine's (and back). The local
  switches are interleaved with the real ones, so drift hits both. ``switch_ratio_p50`` is the
  time-shared switch's p50 over the local one's: what the two remote calls, the deadline
  bookkeeping and the state checks cost on top of the memory work (goal: close to 1 for
  footprints of hundreds of MiB).
* memory: the sum of both components' footprints awake (what colocating them without taking
  turns would need). A sampler reads every rank's resident set (``TimeSharing.resident_bytes``)
  every ``--sample-ms`` during the whole run, switches included; a footprint is RSS above the
  rank's own asleep baseline. ``peak_over_sum`` is the pair's peak over that sum (goal: about
  larger / sum, 0.5 for equal sizes); ``peak_over_larger`` should be about 1.

The last line printed is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

import harness
import numpy as np

from rlinfra import Cluster, ComponentPlacement, Worker, WorkerGroup
from rlinfra.runtime.layout import Layout
from rlinfra.runtime.timeshared import TimeShared, release_freed_memory
from rlinfra.runtime.timesharing import TimeSharing

MIB = 2**20
BLOCK_MIB = 16  # a large model's tensors: each above glibc's mmap threshold once it has grown


def buffers(mib: int, value: float) -> list[np.ndarray]:
    """``mib`` MiB of float32 in blocks, every page written (an onload touches every byte)."""
    return [np.full(BLOCK_MIB * MIB // 4, value, dtype=np.float32) for _ in range(max(1, mib // BLOCK_MIB))]


def held_bytes(arrays: list[np.ndarray]) -> int:
    return sum(array.nbytes for array in arrays)


class Trainer(TimeShared):
    """Parameters and Adam's two moments; ``train_step`` reads and writes all of them."""

    def __init__(self, param_mib: int) -> None:
        self.param_mib = param_mib
        self.state: dict[str, list[np.ndarray]] = {}

    def sleep(self) -> None:
        self.state = {}

    def wake(self) -> None:
        self.state = {name: buffers(self.param_mib, 0.0) for name in ("params", "exp_avg", "exp_avg_sq")}

    def train_step(self) -> int:
        for param, avg, avg_sq in zip(*self.state.values(), strict=True):
            avg += 0.1
            avg_sq += 0.01
            param -= 1e-3 * avg
        return sum(held_bytes(arrays) for arrays in self.state.values())


class Engine(TimeShared):
    """Weights and a KV cache; ``generate`` writes the cache."""

    def __init__(self, weight_mib: int, kv_mib: int) -> None:
        self.weight_mib, self.kv_mib = weight_mib, kv_mib
        self.weights: list[np.ndarray] = []
        self.kv_cache: list[np.ndarray] = []

    def sleep(self) -> None:
        self.weights, self.kv_cache = [], []

    def wake(self) -> None:
        self.weights, self.kv_cache = buffers(self.weight_mib, 1.0), buffers(self.kv_mib, 0.0)

    def generate(self) -> int:
        for block in self.kv_cache:
            block += 1.0
        return held_bytes(self.weights) + held_bytes(self.kv_cache)


class LocalSwitch(Worker):
    """The baseline: both toys' memory work in one process, no orchestration."""

    def __init__(self, param_mib: int, kv_mib: int) -> None:
        self.param_mib, self.kv_mib = param_mib, kv_mib
        self.held: list[np.ndarray] = buffers(3 * param_mib, 0.0)

    def switch(self, to: str) -> float:
        started = time.perf_counter()
        self.held = []
        release_freed_memory()
        mib = 3 * self.param_mib if to == "trainer" else self.param_mib + self.kv_mib
        self.held = buffers(mib, 0.0)
        return time.perf_counter() - started


class Sampler(threading.Thread):
    """Reads both components' resident sets every ``period_s`` until stopped."""

    def __init__(self, schedule: TimeSharing, period_s: float) -> None:
        super().__init__(daemon=True)
        self.schedule, self.period_s = schedule, period_s
        self.samples: list[dict[str, list[int]]] = []
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            self.samples.append({name: self.schedule.resident_bytes(name) for name in ("trainer", "engine")})
            self.done.wait(self.period_s)


def measure(args: argparse.Namespace) -> dict[str, float]:
    ranks = args.ranks
    cfg = {
        "cluster": {
            "num_nodes": 1,
            "simulate": f"1x{2 * ranks}",
            "component_placement": {"trainer,engine": f"0-{ranks - 1}", "local": f"{ranks}-{2 * ranks - 1}"},
        }
    }
    with Cluster(cluster_cfg=cfg["cluster"]) as cluster:
        placement = ComponentPlacement(cfg, cluster)
        with Layout(cluster, placement, ["trainer", "engine", "local"], num_cpus=0.5) as layout:

            def start(cls: type[Worker], name: str, *init: int) -> WorkerGroup:
                strategy = placement.get_strategy(name)
                return cls.create_group(*init).launch(
                    cluster, strategy, name=name, layout=layout, num_cpus=0.5
                )

            trainer = start(Trainer, "trainer", args.param_mib)
            engine = start(Engine, "engine", args.param_mib, args.kv_mib)
            local = start(LocalSwitch, "local", args.param_mib, args.kv_mib)
            try:
                return run_switches(args, trainer, engine, local)
            finally:
                for group in (trainer, engine, local):
                    group.shutdown()


def run_switches(
    args: argparse.Namespace, trainer: WorkerGroup, engine: WorkerGroup, local: WorkerGroup
) -> dict[str, float]:
    with TimeSharing([trainer, engine], timeout=120) as schedule:
        asleep = {name: schedule.resident_bytes(name) for name in ("trainer", "engine")}
        for name in ("trainer", "engine") * args.warmup:  # first touches, allocator growth
            schedule.wake(name)
            local.switch(name).wait()
        warm = len(schedule.switches)
        sampler = Sampler(schedule, args.sample_ms / 1e3)
        sampler.start()
        local_s: list[float] = []
        for turn in range(args.switches):
            name = ("trainer", "engine")[turn % 2]
            schedule.wake(name)
            (trainer.train_step() if name == "trainer" else engine.generate()).wait()
            local_s.append(max(local.switch(name).wait()))
        sampler.done.set()
        sampler.join(timeout=30)
        switches = schedule.switches[warm:]

    def footprint(sample: dict[str, list[int]], name: str) -> int:
        return sum(now - base for now, base in zip(sample[name], asleep[name], strict=True))

    trainer_awake = max(footprint(s, "trainer") for s in sampler.samples)
    engine_awake = max(footprint(s, "engine") for s in sampler.samples)
    peak = max(footprint(s, "trainer") + footprint(s, "engine") for s in sampler.samples)
    total = [switch.total_s for switch in switches]
    figures = {
        "switch_p50_ms": statistics.median(total) * 1e3,
        "switch_p99_ms": float(np.percentile(total, 99)) * 1e3,
        "sleep_p50_ms": statistics.median(s.sleep_s for s in switches) * 1e3,
        "wake_p50_ms": statistics.median(s.wake_s for s in switches) * 1e3,
        "local_p50_ms": statistics.median(local_s) * 1e3,
        "local_p99_ms": float(np.percentile(local_s, 99)) * 1e3,
        "trainer_awake_mib": trainer_awake / MIB,
        "engine_awake_mib": engine_awake / MIB,
        "sum_awake_mib": (trainer_awake + engine_awake) / MIB,
        "peak_pair_mib": peak / MIB,
        "samples": len(sampler.samples),
    }
    figures = {key: round(value, 3) for key, value in figures.items()}
    figures["switch_ratio_p50"] = round(figures["switch_p50_ms"] / figures["local_p50_ms"], 3)
    figures["switch_ratio_p99"] = round(figures["switch_p99_ms"] / figures["local_p99_ms"], 3)
    figures["peak_over_sum"] = round(peak / (trainer_awake + engine_awake), 3)
    figures["peak_over_larger"] = round(peak / max(trainer_awake, engine_awake), 3)
    return figures


def main() -> None:
    parser = harness.parser(__doc__)
    parser.add_argument("--ranks", type=int, default=1, help="processes per component")
    parser.add_argument("--param-mib", type=int, default=128, help="trainer parameters = engine weights")
    parser.add_argument("--kv-mib", type=int, default=192)
    parser.add_argument("--switches", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=2, help="round trips not counted")
    parser.add_argument("--sample-ms", type=float, default=20.0)
    args = parser.parse_args()
    if args.smoke:  # one warm-up round trip and two counted: the sampler sees both components awake
        args.param_mib, args.kv_mib, args.switches, args.warmup = BLOCK_MIB, BLOCK_MIB, 4, 1
    figures = measure(args)
    print(
        f"switch: p50 {figures['switch_p50_ms']:.1f} ms, p99 {figures['switch_p99_ms']:.1f} ms "
        f"(sleep p50 {figures['sleep_p50_ms']:.1f} ms, wake p50 {figures['wake_p50_ms']:.1f} ms); "
        f"same memory work in one process: p50 {figures['local_p50_ms']:.1f} ms, "
        f"p99 {figures['local_p99_ms']:.1f} ms; ratio p50 {figures['switch_ratio_p50']:.2f}, "
        f"p99 {figures['switch_ratio_p99']:.2f}"
    )
    print(
        f"memory: trainer {figures['trainer_awake_mib']:.0f} MiB, engine {figures['engine_awake_mib']:.0f} "
        f"MiB awake (sum {figures['sum_awake_mib']:.0f} MiB); peak of the pair "
        f"{figures['peak_pair_mib']:.0f} MiB over {figures['samples']:.0f} samples = "
        f"{figures['peak_over_sum']:.2f} of the sum, {figures['peak_over_larger']:.2f} of the larger"
    )
    settings = {
        "ranks": args.ranks,
        "param_mib": args.param_mib,
        "kv_mib": args.kv_mib,
        "switches": args.switches,
    }
    goals = {"peak_over_larger": "about 1", "switch_ratio_p50": "close to 1"}
    harness.emit({"benchmark": "timesharing", **settings, "goals": goals, **figures}, args.smoke)


if __name__ == "__main__":
    main()
