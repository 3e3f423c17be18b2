"""The GRPO job on vLLM: its engines against vLLM alone, its weight swaps against a raw load, and
its time to target next to the job's own sampler and the one-process baseline.

Baselines, measured in the same run:
- ``vllm.LLM`` alone in this process (the same checkpoint, settings and sampling parameters as the
  job's engines), on one step's whole batch (prompts_per_step x G completions). Against it: the
  job's two engines (``VLLMRolloutWorker`` launched by rlinfra on an embedded Ray, half the batch
  each, the driver's clock: Ray calls, version gate and ``Completion``s included), with nothing
  else running (goal >= 0.8x); one such engine with the whole batch, against vLLM alone on the
  engine's CPU share (one thread: what hosting costs; goal >= 0.95x); and the engines inside the
  job (their own clock, while the actor trains beside them on the same cores). vLLM alone samples
  with a seed per call, as the engines do;
- one version put into that one process's model by vLLM's own ``load_weights`` (the floor of a
  swap): the job's pause per update (pause -> load on every worker -> check every shard -> resume,
  the driver's clock) against it, and as a fraction of the actor's update (goal <= 5 %);
- ``vllm.LLM(tensor_parallel_size=2)`` alone (its two workers in processes of its own, as the
  engine runs them) against one hosted engine owning two simulated devices, and the job at TP 2
  (``vllm_tp2.yaml``, a fixed number of updates): its pause against the same raw load;
- ``examples/grpo_lm/lm/train_local.py`` (the same GRPO in one process, no Ray) and the job with
  ``engine: hf`` (``disaggregated.yaml``): time to warm-up + 0.25 held-out exact match next to the
  job on vLLM (``vllm.yaml``); goal: within 10 minutes.

The jobs run as a user runs them (``rlinfra run CONFIG`` in a subprocess) and are read from their
outputs, the log-prob probe's ``logprob_mismatch`` included; each ``vllm.LLM`` alone runs in a
process of its own (``--alone TP``). ``--smoke`` runs the TP 2 job for two updates and TP 1 beside
it; as its figures mean nothing, the job and vLLM alone run side by side with the hosted engines,
from a warm-up made once before them. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

import harness

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.grpo_lm import GOAL_S, local_config, run_layout, run_local, settings  # noqa: E402
from examples.grpo_lm.lm.config import GRPOConfig  # noqa: E402
from examples.grpo_lm.lm.task import PromptSampler  # noqa: E402
from examples.grpo_lm.lm.warmup import warm_start  # noqa: E402
from rlinfra.driver.metrics import read_metrics  # noqa: E402

THROUGHPUT_GOAL, PAUSE_GOAL, ONE_ENGINE_GOAL = 0.8, 0.05, 0.95
TP2_UPDATES = 30


def vllm_alone(
    config: GRPOConfig, engine: dict[str, Any], repeats: int = 20, tp: int = 1
) -> dict[str, float]:
    """Tokens/s of one ``vllm.LLM`` in this process on one step's batch (a seed per call, as the
    engines sample), and at TP 1 the time of vLLM's own ``load_weights`` of a whole version in it."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    import torch
    import vllm
    from transformers import AutoTokenizer
    from vllm import _custom_ops

    from rlinfra.engines.vllm import read_checkpoint

    _custom_ops._supports_onednn = False
    path = warm_start(config.cache_dir, config, log=lambda _: None)
    llm = vllm.LLM(
        model=str(path),
        dtype=engine["dtype"],
        seed=config.seed,
        enforce_eager=True,
        kv_cache_memory_bytes=engine["kv_cache_mib"] * 2**20,
        logprobs_mode="processed_logprobs",
        tensor_parallel_size=tp,
        distributed_executor_backend="mp" if tp > 1 else None,
    )
    tokenizer = AutoTokenizer.from_pretrained(path)
    sampler = PromptSampler("benchmark")
    tokens, seconds = 0, 0.0
    for index in range(repeats + 1):
        params = vllm.SamplingParams(  # seeded per call, as the engines sample (vLLM's slower seeded path)
            n=config.group_size,
            temperature=config.temperature,
            max_tokens=config.max_new_tokens,
            logprobs=0,
            seed=index,
        )
        prompts = [
            {"prompt_token_ids": tokenizer(p)["input_ids"]} for p in sampler.sample(config.prompts_per_step)
        ]
        started = time.perf_counter()
        outputs = llm.generate(prompts, params, use_tqdm=False)
        if index:  # the first call warms up
            seconds += time.perf_counter() - started
            tokens += sum(len(s.token_ids) for request in outputs for s in request.outputs)
    if tp > 1:
        llm.llm_engine.engine_core.shutdown()  # its worker processes end with it
        return {"tokens_per_s": round(tokens / seconds, 1)}
    (model,) = llm.apply_model(lambda model: model)
    version = {name: tensor + 1e-3 for name, tensor in read_checkpoint(str(path)).items()}
    loads = []
    with torch.no_grad():
        for _ in range(repeats):
            started = time.perf_counter()
            model.load_weights(weights=iter(version.items()))  # vLLM's own loader: the floor of a swap
            loads.append(time.perf_counter() - started)
    return {
        "tokens_per_s": round(tokens / seconds, 1),
        "raw_load_ms": round(1e3 * statistics.median(loads), 3),
        "parameters_mib": round(sum(v.numel() * v.element_size() for v in version.values()) / 2**20, 2),
    }


def engines_alone(
    config: GRPOConfig, engine: dict[str, Any], repeats: int = 20, tp2: bool = True
) -> dict[str, float]:
    """Tokens/s of the job's engine class launched by rlinfra (embedded Ray, simulated GPUs),
    nothing else running, by the driver's clock: two engines with half of one step's batch each
    (as the job splits it), one with the whole batch, and (``tp2``) one owning two devices."""
    from examples.grpo_lm.vllm_rollout import VLLMRolloutWorker
    from rlinfra import Cluster, ComponentPlacement

    placed = {"rollout": "0-1", **({"rollout_tp2": "2-3:0"} if tp2 else {})}
    section = {"num_nodes": 1, "simulate": "1x4" if tp2 else "1x2", "component_placement": placed}
    settings = {"dtype": engine["dtype"], "kv_cache_mib": engine["kv_cache_mib"]}
    path = str(warm_start(config.cache_dir, config, log=lambda _: None))
    sampler, figures = PromptSampler("benchmark"), {}
    runs = {"rollout": [("two_engines", [0, 1]), ("one_engine", [0])], "rollout_tp2": [("tp2_engine", [0])]}
    with Cluster(cluster_cfg=section) as cluster:
        # One component at a time: only the measured engines' processes are alive.
        for component in placed:
            group = VLLMRolloutWorker.create_group(config, path, settings).launch(
                cluster,
                ComponentPlacement({"cluster": section}, cluster).get_strategy(component),
                name=component,
                max_concurrency=2,
                launch_timeout=300,
            )
            group.set_initial_weights().wait()
            for name, ranks in runs[component]:
                tokens, seconds = 0, 0.0
                for index in range(repeats + 1):
                    prompts = sampler.sample(config.prompts_per_step)
                    shares = [(f"{name}:{i}", prompts[i :: len(ranks)], index) for i in range(len(ranks))]
                    started = time.perf_counter()
                    done = group.call(VLLMRolloutWorker.generate, ranks, per_rank=shares).wait()
                    if index:
                        seconds += time.perf_counter() - started
                        tokens += sum(batch.payload["tokens"] for batch in done)
                figures[f"{name}_tokens_per_s"] = round(tokens / seconds, 1)
            group.shutdown()
    return figures


def alone_in_a_process(tp: int, seed: int, smoke: bool, threads: int | None = None) -> dict[str, float]:
    """``vllm_alone`` in a fresh process (one ``vllm.LLM`` per process, as vLLM expects). With
    ``threads``, it gets an engine's CPU share: Ray gives an actor owning k devices
    ``OMP_NUM_THREADS=k`` (one CPU per device), so one engine is compared with vLLM computing on
    as many threads; without, vLLM takes what the machine gives it."""
    command = [
        sys.executable,
        __file__,
        "--alone",
        str(tp),
        "--seed",
        str(seed),
        *(["--smoke"] if smoke else []),
    ]
    env = {**os.environ, **({"OMP_NUM_THREADS": str(threads)} if threads else {})}
    done = subprocess.run(command, capture_output=True, text=True, timeout=900, check=False, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"vllm.LLM alone at TP {tp} exited {done.returncode}:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def probe_figures(output: Path) -> dict[str, float]:
    mismatches = [
        r["logprob_mismatch"] for r in read_metrics(output) if r.get("logprob_mismatch") is not None
    ]
    return {"logprob_mismatch_median": statistics.median(mismatches), "logprob_mismatch_max": max(mismatches)}


def main() -> None:
    parser = harness.parser(__doc__)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--alone", type=int, metavar="TP", help=argparse.SUPPRESS)
    args = parser.parse_args()
    from omegaconf import OmegaConf

    from rlinfra.config.loading import load_config

    engine = dict(OmegaConf.to_container(load_config(ROOT / "examples" / "grpo_lm" / "vllm.yaml")["engine"]))
    repeats = 1 if args.smoke else 20
    with tempfile.TemporaryDirectory() as folder:
        algo = settings(args.smoke, Path(folder))
        config = local_config("vllm", args.seed, algo)
        if args.alone:  # the child of ``alone_in_a_process``
            print(json.dumps(vllm_alone(config, engine, repeats, tp=args.alone)))
            return
        rows: dict[str, dict[str, Any]] = {} if args.smoke else {"local": run_local(config)}
        for layout in () if args.smoke else ("disaggregated", "vllm"):
            rows[layout] = run_layout(layout, args.seed, Path(folder), algo)
        fixed = {**algo, "updates": algo.get("updates", TP2_UPDATES), "stop_at_target": "false"}
        tp2_job = partial(run_layout, "vllm_tp2", args.seed, Path(folder), fixed)
        alone_tp1 = partial(alone_in_a_process, 1, args.seed, args.smoke)
        if args.smoke:  # figures that mean nothing: the three parts side by side (module docstring)
            warm_start(config.cache_dir, config, log=lambda _: None)  # else each part would make it
            with ThreadPoolExecutor(max_workers=2) as beside:
                job_done, alone_done = beside.submit(tp2_job), beside.submit(alone_tp1)
                hosted = engines_alone(config, engine, repeats, tp2=False)
                rows["vllm_tp2"], alone = job_done.result(), alone_done.result()
            one_cpu, alone_tp2 = alone, {}
        else:
            rows["vllm_tp2"] = tp2_job()
            hosted = engines_alone(config, engine, repeats)
            alone = alone_tp1()
            one_cpu = alone_in_a_process(1, args.seed, args.smoke, threads=1)
            alone_tp2 = alone_in_a_process(2, args.seed, args.smoke, threads=2)
        for layout in rows.keys() - {"local"}:
            rows[layout] |= probe_figures(Path(folder) / layout)
    job, tp2 = rows.get("vllm", rows["vllm_tp2"]), rows["vllm_tp2"]
    for name, figure in hosted.items():
        baseline = {"tp2": alone_tp2, "one": one_cpu}.get(name.partition("_")[0], alone)
        job[f"{name.removesuffix('_tokens_per_s')}_vs_vllm_alone"] = round(
            figure / baseline["tokens_per_s"], 3
        )
    job["in_job_vs_vllm_alone"] = round(job["tokens_per_s"] / alone["tokens_per_s"], 3)
    paused = {"TP 1": job, "TP 2": tp2} if job is not tp2 else {"TP 2": tp2}  # the smoke runs TP 2 only
    for row in paused.values():
        row["pause_vs_raw_load"] = round(row["pause_ms"] / alone["raw_load_ms"], 1)
    header = ("run", "reached", "warm", "final", "to target", "updates", "tok/s", "pause", "mismatch")
    print(f"{header[0]:<14}" + "".join(f"{h:>11}" for h in header[1:]))
    for name, row in rows.items():
        ttt = row["time_to_target_s"]
        cells = (
            row["reached"],
            f"{row['warm_accuracy']:.3f}",
            f"{row['accuracy']:.3f}",
            f"{ttt:.1f}s" if ttt is not None else "-",
            row["updates"],
            row.get("tokens_per_s", "-"),
            row.get("pause_fraction", "-"),
            f"{row['logprob_mismatch_max']:.1e}" if "logprob_mismatch_max" in row else "-",
        )
        print(f"{name:<14}" + "".join(f"{cell!s:>11}" for cell in cells))
    print(f"vllm.LLM alone, one step's batch: {alone}; on one CPU: {one_cpu}; at TP 2: {alone_tp2}")
    print(f"the job's engines launched by rlinfra: {hosted}")
    print(
        f"tokens/s vs vLLM alone: two engines {job['two_engines_vs_vllm_alone']}x, one engine "
        f"{job['one_engine_vs_vllm_alone']}x, inside the job (beside the training actor) "
        f"{job['in_job_vs_vllm_alone']}x"
        + (f", one TP 2 engine vs vllm.LLM at TP 2 {job['tp2_engine_vs_vllm_alone']}x" if alone_tp2 else "")
    )
    for name, row in paused.items():
        print(
            f"pause at {name}: {row['pause_ms']} ms per update ({row['pause_vs_raw_load']}x a raw "
            f"load_weights, {100 * row['pause_fraction']:.1f} % of the update)"
        )
    goals = {
        "reached_within_10_min": bool(job["reached"]) and (job["time_to_target_s"] or GOAL_S + 1) <= GOAL_S,
        "throughput": job["two_engines_vs_vllm_alone"] >= THROUGHPUT_GOAL,
        "one_engine": job["one_engine_vs_vllm_alone"] >= ONE_ENGINE_GOAL,
        "pause_tp1": job["pause_fraction"] <= PAUSE_GOAL,
        "pause_tp2": tp2["pause_fraction"] <= PAUSE_GOAL,
    }
    summary = {
        "benchmark": "vllm_engine",
        "rows": rows,
        "vllm_alone": alone,
        "vllm_alone_one_cpu": one_cpu,
        "vllm_alone_tp2": alone_tp2,
        "hosted": hosted,
        "goals": goals,
    }
    harness.emit(summary, args.smoke)


if __name__ == "__main__":
    main()
