"""Weight updates: a 256 MiB state dict (many tensors of mixed sizes and dtypes) from a trainer to
four rollout workers, on one node and across two simulated nodes, for each transport.

Figures per (layout, transport), median of ``--repeat`` updates:

* ``bandwidth_ratio``: the update's effective bandwidth (bytes / prepare time) over a raw baseline
  measured in the same run — the driver ``ray.put``s the same bytes in the same bucket size and
  four plain actors ``ray.get`` each bucket and end up holding it as the transport's receivers do:
  copied into a buffer of their own (``object_store``, ``broadcast``), or kept as
  Ray's zero-copy view, every bucket handed out as soon as it is put (``object_store_shared``).
  Each update is paired with the raw round run right after it and the median of the pairs'
  ratios is reported, so that drifts in the machine's speed cancel. Goal >= 0.8.
* ``pause_fraction``: pause → resume window over the whole update, as the driver sees it (pause
  sent → every resume answered). Goal <= 5 %. ``held_fraction``: the same for the time generation
  is actually held — the longest any worker's gate stayed closed, by the worker's own clock.
* ``cpu_ceiling``: the best ``bandwidth_ratio`` this machine allows when every process shares too
  few cores (as on a 2-core machine), from per-byte costs timed in the same run: raw moves the
  bytes with one put and one copy per receiver; an update also hashes them once on the sender
  and once per receiver (fused with the copy), so the ceiling is
  ``(put + R copy) / (put + hash + R copy-and-hash)``. ``ratio_of_ceiling`` says how close the
  transport comes to it. One node only: across nodes both sides also pay the pull between object
  stores, which the formula leaves out.
* ``checksum_overhead``: what the checksums cost, measured: each repeat also runs an update with
  ``WeightSync(checksums=False)`` (versions verified, no byte hashed), and the overhead is
  ``1 - without / with`` of the median update times. Goal <= 10 %.

Steady state is measured: ``--warmup`` updates (and raw rounds) run first and are not counted,
because the first two updates allocate the receivers' shadow buffers (page faults on every byte)
and from then on double buffering reuses them — as in an RL loop with hundreds of updates.
The last line printed is one JSON object with every figure.
"""

from __future__ import annotations

import statistics
import time

import harness
import numpy as np
import ray
import xxhash

from rlinfra import Cluster, ComponentPlacement, Worker
from rlinfra.runtime import rendezvous
from rlinfra.services.weights import WeightReceiver, WeightSender, WeightSync
from rlinfra.services.weights.buckets import checksum, copy_and_hash

MIB = 2**20
BUCKET_BYTES = 32 * MIB  # two in flight fit the simulated nodes' 150 MiB object stores
SIZE_MIB, SMOKE_MIB = 256, 80  # the smoke's state: the 64 MiB embedding, a few layers, three buckets


def make_state(total_mib: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Mixed sizes and dtypes: a big embedding, many layers, small norms and counters."""
    rng = np.random.default_rng(seed)
    state: dict[str, np.ndarray] = {"embed": rng.standard_normal((8192, 2048), dtype=np.float32)}  # 64 MiB
    layer = 0
    while sum(a.nbytes for a in state.values()) < total_mib * MIB - 2 * MIB:
        state[f"layers.{layer}.w"] = rng.standard_normal((1024, 1024), dtype=np.float32)  # 4 MiB
        state[f"layers.{layer}.norm"] = np.ones(1024, dtype=np.float16)
        state[f"layers.{layer}.steps"] = np.zeros(8, dtype=np.int64)
        layer += 1
    return state


class Trainer(WeightSender, Worker):
    def __init__(self, total_mib: int) -> None:
        self.state = make_state(total_mib)

    def weights_state(self):
        return self.state

    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.state.values())


class Rollout(WeightReceiver, Worker):
    def ping(self) -> int:
        return self.weight_version


@ray.remote(num_cpus=0)
class RawReceiver:
    def __init__(self) -> None:
        self.buffers: dict[int, np.ndarray] = {}
        self.held: dict[int, np.ndarray] = {}

    def receive(self, index: int, payload: np.ndarray) -> int:
        target = self.buffers.setdefault(index, np.empty(payload.nbytes, dtype=np.uint8))
        np.copyto(target, payload)
        return payload.nbytes

    def hold(self, index: int, payload: np.ndarray) -> int:
        self.held[index] = payload  # Ray's read-only view of the object store: nothing copied
        return payload.nbytes

    def drop(self) -> None:
        self.held = {}


def raw_baseline(state: dict[str, np.ndarray], receivers: list, zero_copy: bool = False) -> float:
    """Seconds to move the same bytes, bucket by bucket, with plain put + get, then a copy into
    each receiver's buffer; or, ``zero_copy``, keeping what ``get`` returns, with every bucket
    handed out as soon as it is put and the answers awaited at the end."""
    flat = np.concatenate([a.reshape(-1).view(np.uint8) for a in state.values()])
    start = time.perf_counter()
    pending = []
    for index, offset in enumerate(range(0, flat.nbytes, BUCKET_BYTES)):
        ref = ray.put(flat[offset : offset + BUCKET_BYTES])
        if zero_copy:
            pending += [r.hold.remote(index, ref) for r in receivers]
        else:
            ray.get([r.receive.remote(index, ref) for r in receivers], timeout=120)
        del ref
    ray.get(pending, timeout=120)
    elapsed = time.perf_counter() - start
    if zero_copy:
        ray.get([r.drop.remote() for r in receivers], timeout=120)
    return elapsed


def per_bucket_costs() -> dict[str, float]:
    """Seconds to copy, hash, and copy-and-hash one bucket here (median of 9, after a warm-up)."""
    source = np.random.default_rng(1).integers(0, 255, BUCKET_BYTES, dtype=np.uint8)
    target = np.ones(BUCKET_BYTES, dtype=np.uint8)

    def timed(action) -> float:
        action()
        samples = []
        for _ in range(9):
            started = time.perf_counter()
            action()
            samples.append(time.perf_counter() - started)
        return statistics.median(samples)

    return {
        "copy": timed(lambda: np.copyto(target, source)),
        "hash": timed(lambda: checksum(source)),
        "copy_and_hash": timed(lambda: copy_and_hash(target, source, xxhash.xxh3_64())),
    }


def cpu_ceiling(costs: dict[str, float], receivers: int) -> float:
    raw = costs["copy"] * (1 + receivers)
    ours = costs["copy"] + costs["hash"] + receivers * costs["copy_and_hash"]
    return raw / ours


def measure(
    layout: str,
    simulate: str,
    rollout_placement: str,
    repeat: int,
    warmup: int,
    transports: list[str],
    total_mib: int,
) -> list[dict]:
    cfg = {
        "cluster": {
            "num_nodes": len(simulate.split(",")),
            "simulate": simulate,
            "component_placement": {"trainer": "0", "rollout": rollout_placement},
            # object_store_shared keeps two versions in each node's store, and the raw rounds
            # hold one more while they run.
            "simulate_object_store_mib": 1024,
        }
    }
    rows = []
    with Cluster(cluster_cfg=cfg["cluster"]) as cluster:
        placement = ComponentPlacement(cfg, cluster)
        trainer = Trainer.create_group(total_mib).launch(
            cluster, placement.get_strategy("trainer"), name="trainer"
        )
        rollout = Rollout.create_group().launch(
            cluster, placement.get_strategy("rollout"), name="rollout", max_concurrency=2
        )
        nbytes = trainer.nbytes().wait()[0]
        state = make_state(total_mib)
        raw_nodes = [p.cluster_node_rank for p in rollout.placements]
        raw = [
            RawReceiver.options(
                scheduling_strategy=ray.util.scheduling_strategies.NodeAffinitySchedulingStrategy(
                    cluster.node(node).node_id, soft=False
                )
            ).remote()
            for node in raw_nodes
        ]
        info = rendezvous.bring_up_cross(
            "weights", [(trainer, [0]), (rollout, rollout.ranks)], backend="gloo"
        )
        version = 0
        for transport in transports:
            sync = WeightSync(
                trainer,
                rollout,
                transport=transport,
                bucket_bytes=BUCKET_BYTES,
                cross_group="weights",
                initial_version=version,
            )
            zero_copy = transport == "object_store_shared"
            for _ in range(warmup):
                version += 1
                sync.update(version)
                raw_baseline(state, raw, zero_copy)
            updates, raws, unhashed = [], [], []
            for _ in range(repeat):
                version += 1
                updates.append(sync.update(version))
                raws.append(raw_baseline(state, raw, zero_copy))
                sync.checksums = False
                version += 1
                unhashed.append(sync.update(version))
                sync.checksums = True
            prepare = statistics.median(u.prepare_s for u in updates)
            total = statistics.median(u.total_s for u in updates)
            pause = statistics.median(u.pause_s for u in updates)
            held = statistics.median(u.held_s for u in updates)
            raw_s = statistics.median(raws)
            pair_ratio = statistics.median(r / u.prepare_s for r, u in zip(raws, updates, strict=True))
            row = {
                "layout": layout,
                "transport": transport,
                "mib": round(nbytes / MIB, 1),
                "update_s": round(total, 3),
                "prepare_s": round(prepare, 3),
                "raw_s": round(raw_s, 3),
                "bandwidth_gbps": round(nbytes / prepare / 1e9, 3),
                "raw_bandwidth_gbps": round(nbytes / raw_s / 1e9, 3),
                # Each update is paired with the raw round right after it, so drifts in this
                # machine's speed cancel within a pair: the median of the pairs' ratios.
                "bandwidth_ratio": round(pair_ratio, 3),
                "pause_ms": round(pause * 1e3, 1),
                "pause_fraction": round(pause / total, 4),
                "held_ms": round(held * 1e3, 1),
                "held_fraction": round(held / total, 4),
                "checksum_overhead": (
                    round(1 - statistics.median(u.total_s for u in unhashed) / total, 3) if unhashed else None
                ),
            }
            overhead = "n/a" if row["checksum_overhead"] is None else f"{row['checksum_overhead']:.1%}"
            one_node = {p.cluster_node_rank for p in rollout.placements + trainer.placements} == {0}
            if transport == "object_store" and one_node:  # across nodes, both sides also pull copies
                ceiling = cpu_ceiling(per_bucket_costs(), len(rollout.placements))
                row["cpu_ceiling"] = round(ceiling, 3)
                row["ratio_of_ceiling"] = round(row["bandwidth_ratio"] / ceiling, 3)
            print(
                f"{layout:>10} {transport:>12}: update {row['update_s']:.2f} s, "
                f"{row['bandwidth_gbps']:.2f} GB/s vs raw {row['raw_bandwidth_gbps']:.2f} GB/s "
                f"(ratio {row['bandwidth_ratio']:.2f}), pause {row['pause_ms']:.1f} ms "
                f"({row['pause_fraction']:.1%}; held {row['held_ms']:.1f} ms), "
                f"checksums cost {overhead}"
                + (f", CPU ceiling {row['cpu_ceiling']:.2f}" if "cpu_ceiling" in row else "")
            )
            rows.append(row)
        rendezvous.tear_down_cross(info)
        trainer.shutdown()
        rollout.shutdown()
    return rows


def main() -> None:
    parser = harness.parser(__doc__)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--layouts", default="one node,two nodes")
    parser.add_argument("--transports", default="object_store,object_store_shared,broadcast")
    args = parser.parse_args()
    if args.smoke:
        args.repeat, args.warmup = 1, 0
    transports = args.transports.split(",")
    layouts = {"one node": ("8", "1-4"), "two nodes": ("4,4", "1-2,4-5")}
    size = SMOKE_MIB if args.smoke else SIZE_MIB
    rows = []
    for name in args.layouts.split(","):
        simulate, rollout = layouts[name]
        rows += measure(name, simulate, rollout, args.repeat, args.warmup, transports, size)
    goals = {"bandwidth_ratio": ">= 0.8", "pause_fraction": "<= 0.05", "checksum_overhead": "<= 0.10"}
    harness.emit({"benchmark": "weight_sync", "rows": rows, "goals": goals}, args.smoke)


if __name__ == "__main__":
    main()
