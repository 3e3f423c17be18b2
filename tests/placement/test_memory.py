"""The memory model's arithmetic, checked against published figures and by its own invariants:
vLLM's KV capacity for Llama-3.1-8B and Qwen3-14B as their issues report it, the ZeRO paper's
16 bytes per parameter and torchtitan's FSDP difference, time-shared devices at their peak phase,
and a refusal that names the phase, the largest terms, the shortfall and the changes that fit."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from rlinfra.config import ConfigError
from rlinfra.config.loading import load_config
from rlinfra.placement import ClusterSpec, ComponentPlacement, PlacementError
from rlinfra.placement.memory import (
    GIB,
    Declared,
    EngineMemory,
    TrainerMemory,
    assumptions,
    device_memory,
    kv_cache,
    parse_memory,
    process_terms,
    refuse_overfull,
    trainer_terms,
)
from rlinfra.placement.model_size import ModelShape, read_model_config

MODELS = Path(__file__).parents[2] / "examples" / "memory"


def shape(name: str) -> ModelShape:
    return ModelShape.of(read_model_config(MODELS / f"{name}.json"))


def engine(**settings) -> EngineMemory:
    return parse_memory({"role": "engine", **settings}, "cluster.component_placement.rollout.memory")


def trainer(**settings) -> TrainerMemory:
    return parse_memory({"role": "trainer", **settings}, "cluster.component_placement.actor.memory")


@pytest.mark.parametrize(
    ("model", "per_token", "gib", "tokens"),
    [
        ("llama-3.1-8b", 128 * 1024, 2.89, 23_648),  # vllm-project/vllm#10517 (2.89 is rounded)
        ("qwen3-14b", 160 * 1024, 6.51, 42_656),  # LMCache/LMCache#1739
    ],
)
def test_kv_capacity_matches_what_vllm_reported_for_published_models(model, per_token, gib, tokens):
    kv = kv_cache(shape(model), engine(max_model_len=32), tp=1, available=int(gib * GIB))
    assert kv.bytes // (kv.blocks * kv.block_size) == per_token
    assert abs(kv.blocks * kv.block_size - tokens) <= 2 * 16  # within the rounding of "2.89 GiB"


def test_kv_heads_split_over_tensor_parallel_ranks_but_never_below_one():
    qwen = shape("qwen2.5-7b")  # 4 KV heads
    caches = {tp: kv_cache(qwen, engine(), tp, 10 * GIB) for tp in (1, 2, 4, 8)}
    per_block = {tp: kv.bytes // kv.blocks for tp, kv in caches.items()}
    assert per_block[1] == 2 * per_block[2] == 4 * per_block[4]
    assert per_block[8] == per_block[4]  # one head per rank at TP 4 and 8: replicated


def test_a_context_longer_than_the_cache_is_refused_with_vllms_estimate():
    kv = kv_cache(shape("qwen2.5-7b"), engine(max_model_len=131_072), tp=1, available=GIB)
    # 1 GiB / (28 layers × 16 tokens × 4 heads × 2 × 128 × 2 bytes) = 1,170 blocks; one is the null block
    assert kv.blocks == 1170 and kv.fits_max_len == 1169 * 16 < kv.max_model_len
    assert kv.tokens == int(1170 / (131_072 / 16) * 131_072)


def test_trainer_states_are_zeros_16_bytes_per_parameter_divided_by_fsdp_ranks():
    qwen = shape("qwen2.5-7b")
    psi = qwen.parameters
    for precision in ("bf16-mixed", "fp32"):
        states = trainer_terms(qwen, trainer(precision=precision), ranks=8)
        assert states["weights"] + states["gradients"] + states["optimizer"] == 16 * psi
    sharded = trainer_terms(qwen, trainer(sharding="fsdp"), ranks=8)
    assert sharded["weights"] + sharded["gradients"] + sharded["optimizer"] == 16 * psi // 8


def test_fsdp_over_8_versus_128_ranks_predicts_torchtitans_difference():
    """torchtitan's Llama-3.1-8B benchmark: 82.4 GiB peak on 8 GPUs and 67.0 on 128 (15.4 GiB
    apart); the states alone account for 14.0 GiB of it."""
    llama, fsdp = shape("llama-3.1-8b"), trainer(sharding="fsdp")
    states = {
        n: sum(trainer_terms(llama, fsdp, n)[k] for k in ("weights", "gradients", "optimizer"))
        for n in (8, 128)
    }
    assert round((states[8] - states[128]) / GIB, 1) == 14.0


def test_activations_grow_with_the_micro_batch_and_checkpointing_keeps_one_input_per_layer():
    qwen = shape("qwen2.5-7b")
    one, two = (trainer_terms(qwen, trainer(micro_batch=m), 1)["activations"] for m in (1, 2))
    assert two == 2 * one
    kept = trainer_terms(qwen, trainer(activation_checkpointing=True), 1)["activations"]
    assert kept == 28 * 2 * 2048 * qwen.hidden + one // 28
    unfused = trainer_terms(qwen, trainer(flash_attention=False), 1)["activations"]
    assert unfused - one == 28 * 2 * 2048 * 2 * qwen.heads * 2048  # the attention scores


def test_settings_not_written_are_listed_as_assumptions():
    assumed = assumptions(engine(max_model_len=4096))
    assert "gpu_memory_utilization: 0.92" in assumed and "block_size: 16" in assumed
    assert not any(line.startswith(("max_model_len", "role")) for line in assumed)


def test_a_memory_setting_mistake_names_its_key():
    with pytest.raises(
        PlacementError, match=r"actor\.memory\.sharding.*'ddp', 'fsdp'|actor\.memory.*sharding"
    ):
        trainer(sharding="zero9")
    with pytest.raises(PlacementError, match="unknown key 'micro_bach'; did you mean 'micro_batch'"):
        trainer(micro_bach=2)


def _colocated(*, time_shared: bool, util: float = 0.5, micro_batch: int = 1):
    qwen, capacity = shape("qwen2.5-7b"), int(79.65 * GIB)
    actor = Declared(trainer(sharding="fsdp", micro_batch=micro_batch, time_shared=time_shared), qwen, 8)
    rollout = Declared(
        engine(gpu_memory_utilization=util, max_model_len=4096, time_shared=time_shared), qwen, 4
    )
    held = [actor.terms("actor", 1, capacity), rollout.terms("rollout", 2, capacity)]
    return device_memory([(0, 0)], capacity, held), {"actor": actor, "rollout": rollout}


def test_time_shared_components_peak_at_one_phase_and_others_sum():
    shared, _ = _colocated(time_shared=True)
    summed, _ = _colocated(time_shared=False)
    actor, rollout = (terms.total for terms in shared.held)
    assert set(shared.phases) == {"actor awake", "rollout awake"}
    assert shared.phases["actor awake"] == actor + int(2.0 * GIB)  # the asleep engine: its overhead
    assert summed.phases == {"all": actor + rollout}
    assert shared.peak < summed.peak


def test_an_overfull_device_is_refused_with_the_shortfall_and_what_would_fit():
    device, declared = _colocated(time_shared=False, util=0.6, micro_batch=4)
    assert not device.fits
    with pytest.raises(PlacementError) as refused:
        raise refuse_overfull(device, declared, "cluster.component_placement")
    message = str(refused.value)
    short = (device.peak - device.capacity) / GIB
    assert f"node 0 device 0: phase 'all' needs {device.peak / GIB:.1f} GiB" in message
    assert (
        f"short by {short:.1f} GiB" in message
        and "largest: actor activations 42.0 GiB, rollout kv_cache" in message
    )
    assert "actor: micro_batch <= " in message and "rollout: gpu_memory_utilization <= 0." in message
    util = float(message.split("gpu_memory_utilization <= ")[1][:4])
    fixed, _ = _colocated(time_shared=False, util=util, micro_batch=4)
    assert fixed.fits
    too_much, _ = _colocated(time_shared=False, util=util + 0.01, micro_batch=4)
    assert not too_much.fits


QWEN = str(MODELS / "qwen2.5-7b.json")


def plan(components: dict, **cluster) -> ComponentPlacement:
    section = {"num_nodes": 1, "num_gpus_per_node": 8, "component_placement": components} | cluster
    return ComponentPlacement({"cluster": section}, ClusterSpec.from_config(section))


COLOCATED = {
    "actor": {
        "placement": "0-7",
        "model": QWEN,
        "memory": {"role": "trainer", "sharding": "fsdp", "time_shared": True},
    },
    "rollout": {
        "placement": "0-7:0-3",  # 4 engines, 2 devices each: TP 2
        "model": QWEN,
        "memory": {
            "role": "engine",
            "gpu_memory_utilization": 0.85,
            "max_model_len": 8192,
            "time_shared": True,
        },
    },
}


def test_the_plan_predicts_every_device_from_the_yaml_alone():
    placed = plan(COLOCATED, accelerator="H100")
    [device] = placed.memory  # every GPU holds the same: one prediction
    assert device.devices == tuple((0, gpu) for gpu in range(8)) and device.where == "node 0 devices 0-7"
    assert device.capacity == int(79.65 * GIB) and device.fits
    actor, rollout = device.held
    assert (actor.component, rollout.component, rollout.devices) == ("actor", "rollout", 2)
    assert rollout.total == math.ceil(device.capacity * 0.85)  # vLLM takes its share of the device
    assert rollout.terms["weights"] == 7_615_616_512 * 2 // 2  # bf16, split over TP 2
    assert device.phases == {"actor awake": actor.total + int(2 * GIB), "rollout awake": rollout.total + GIB}


def test_a_node_groups_accelerator_overrides_the_clusters():
    components = {
        "actor": {"node_group": "big", "placement": "0", "model": QWEN, "memory": {"role": "reference"}}
    }
    groups = [{"label": "big", "node_ranks": 0, "accelerator": {"memory_gib": 141}}]
    placed = plan(components, accelerator="L4", node_groups=groups)
    assert placed.memory[0].capacity == 141 * GIB


def test_an_overfull_plan_is_refused_before_anything_starts_or_only_warned_when_asked():
    actor = {**COLOCATED["actor"], "memory": {"role": "trainer", "sharding": "fsdp"}}
    rollout = {**COLOCATED["rollout"], "memory": {"role": "engine", "max_model_len": 8192}}  # util 0.92
    with pytest.raises(
        PlacementError, match=r"short by .* GiB(.|\n)*rollout: gpu_memory_utilization <= 0\.68"
    ):
        plan({"actor": actor, "rollout": rollout}, accelerator="H100")
    warned = plan({"actor": actor, "rollout": rollout}, accelerator="H100", memory_check="warn")
    assert len(warned.memory_warnings) == 1
    assert "node 0 devices 0-7: phase 'all' needs" in warned.memory_warnings[0]


@pytest.mark.parametrize(
    ("cluster", "components", "message"),
    [
        ({}, COLOCATED, r"cluster\.accelerator: node 0's accelerators have no memory size"),
        ({"accelerator": "H1000"}, COLOCATED, r"cluster\.accelerator: unknown accelerator 'H1000'.*\n.*H100"),
        (
            {"accelerator": "H100"},
            {"actor": {"placement": "0", "memory": {"role": "trainer"}}},
            r"actor\.model: a memory declaration needs the component's model",
        ),
        (
            {"accelerator": "H100"},
            {"actor": {"placement": "0", "model": QWEN, "memory": {"role": "critic"}}},
            r"actor\.memory\.role: role 'critic'.*\n.*'trainer', 'engine', 'reference'",
        ),
        (
            {"accelerator": "H100"},
            {"actor": {"placement": "0", "model": "/no/such/config.json", "memory": {"role": "trainer"}}},
            r"actor\.model: /no/such/config\.json: cannot read the model's config",
        ),
        (
            {"accelerator": "H100"},
            {"actor": {"placement": "0", "model": "PHI3", "memory": {"role": "trainer"}}},
            r"actor\.model: model_type 'phi3': no parameter count for this architecture",
        ),
        (
            {"accelerator": "H100"},
            {
                "rollout": {
                    "placement": "0",
                    "model": QWEN,
                    "memory": {"role": "engine", "kv_cache_memory_bytes": 2**30},
                }
            },
            r"rollout on node 0 device 0: a KV cache of 1\.00 GiB.*max_model_len 131072"
            r"(.|\n)*max_model_len <= 18704",
        ),
    ],
)
def test_memory_mistakes_are_refused_naming_the_key(cluster, components, message, tmp_path):
    phi3 = tmp_path / "phi3.json"  # an architecture vLLM serves whose parameters the plan cannot count
    phi3.write_text(json.dumps({"model_type": "phi3", "hidden_size": 64}))
    components = json.loads(json.dumps(components).replace("PHI3", str(phi3)))
    with pytest.raises(ConfigError, match=message):
        plan(components, **cluster)


def test_predicted_trainer_states_are_the_bytes_a_ddp_trainer_holds_after_one_step(tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    import torch.distributed as dist

    config = {
        "model_type": "qwen2",
        "vocab_size": 97,
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
    }
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1)
    try:
        model = torch.nn.parallel.DistributedDataParallel(
            transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**config))
        )
        optimizer = torch.optim.AdamW(model.parameters())
        tokens = torch.randint(0, 97, (2, 16))
        model(input_ids=tokens, labels=tokens).loss.backward()
        optimizer.step()
    finally:
        dist.destroy_process_group()
    parameters = list(model.parameters())
    held = {
        "weights": sum(p.nbytes for p in parameters),
        "gradients": sum(p.grad.nbytes for p in parameters),
        "optimizer": sum(optimizer.state[p][m].nbytes for p in parameters for m in ("exp_avg", "exp_avg_sq")),
    }
    predicted = trainer_terms(ModelShape.of(config), trainer(precision="fp32"), ranks=8)
    assert held == {name: predicted[name] for name in held}


def test_the_worked_example_in_the_docs_and_readme_is_what_the_plan_predicts(monkeypatch):
    monkeypatch.chdir(MODELS.parents[1])  # the examples name their model from the repository root
    docs = (MODELS.parents[1] / "docs" / "placement.md").read_text(encoding="utf-8")
    readme = (MODELS.parents[1] / "README.md").read_text(encoding="utf-8")
    gib = {}
    for layout in ("colocated", "disaggregated"):
        section = load_config(MODELS / f"qwen2.5-7b-grpo-{layout}.yaml").cluster
        placed = ComponentPlacement({"cluster": section}, ClusterSpec.from_config(section))
        for device in placed.memory:
            for held in device.held:
                gib[layout, held.component] = f"{held.total / GIB:.1f}"
            gib[layout, device.devices[0][1], "peak"] = f"{device.peak / GIB:.1f}"
        kv = next(h.kv for h in placed.memory[-1].held if h.kv is not None)
        gib[layout, "kv"] = f"{kv.tokens / 1e6:.2f} M tokens, {int(kv.concurrency)} requests of 8,192"
    colocated = [gib["colocated", name] for name in ("actor", "reference", "rollout")]
    disaggregated = [gib["disaggregated", name] for name in ("actor", "reference", "rollout")]
    peak, kv = gib["colocated", 0, "peak"], gib["colocated", "kv"]
    assert f"| 0-7 | {' | '.join(colocated)} (util 0.85) | {peak} (engines awake) | {kv} |" in docs
    assert (
        f"| 0-3 | {disaggregated[0]} | {disaggregated[1]} | — | {gib['disaggregated', 0, 'peak']} | — |"
        in docs
    )
    peak, kv = gib["disaggregated", 4, "peak"], gib["disaggregated", "kv"]
    assert f"| 4-7 | — | — | {disaggregated[2]} (util 0.9) | {peak} | {kv} |" in docs
    assert f"| {' | '.join(colocated)} | {gib['colocated', 0, 'peak']} |" in readme
    peaks = f"{gib['disaggregated', 0, 'peak']} / {gib['disaggregated', 4, 'peak']}"
    assert f"| {' | '.join(disaggregated)} | {peaks} |" in readme


@pytest.mark.timeout(300)
@pytest.mark.parametrize("checkpointing", [False, True], ids=["activations kept", "checkpointing"])
def test_a_7b_trainers_predicted_peak_is_within_10_percent_of_pytorchs_mem_tracker(checkpointing):
    """Qwen2.5-7B, micro-batch 1 of 2,048 tokens, fp32 weights under bf16 autocast, AdamW: built,
    trained one step and measured by PyTorch's MemTracker under FakeTensorMode, which allocates
    nothing (the 117 GiB peak is counted on this laptop-sized machine)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker

    config = read_model_config(MODELS / "qwen2.5-7b.json")
    settings = trainer(micro_batch=1, seq_len=2048, activation_checkpointing=checkpointing)
    predicted = process_terms("actor", ModelShape.of(config), settings, 1, 1, 80 * GIB)
    hf_config = transformers.AutoConfig.for_model(**{k: v for k, v in config.items() if k != "architectures"})
    with FakeTensorMode():
        model = transformers.AutoModelForCausalLM.from_config(hf_config, dtype=torch.float32)
        if checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        optimizer = torch.optim.AdamW(model.parameters(), foreach=False)
        tracker = MemTracker()
        tracker.track_external(model, optimizer)
        with tracker:
            tokens = torch.randint(0, hf_config.vocab_size, (1, 2048))
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = model(input_ids=tokens, labels=tokens).loss
            loss.backward()
            optimizer.step()
        measured = sum(device["Total"] for device in tracker.get_tracker_snapshot("peak").values())
    assert abs(predicted.total - predicted.terms["overhead"] - measured) <= 0.10 * measured
