"""What each process will hold on its devices, predicted from config alone, and whether it fits.

A component that declares ``memory`` (a role and the settings that change its memory) gets its
bytes per device from its model's shape (``model_size``), its ranks and the devices each of its
processes owns (tensor parallelism). Each setting left out is an assumption the plan shows with
its default. The formulas, in bytes, with Ψ parameters and ``e`` bytes per element:

* trainer states: Adam in mixed precision holds 16Ψ (Rajbhandari et al. 2019, ZeRO, §5). PyTorch's
  mixed precision (autocast, FSDP's ``MixedPrecision``) keeps them as fp32 weights (4Ψ), fp32
  gradients (4Ψ) and Adam's two moments (8Ψ), as fp32 training does. FSDP (ZeRO-3) divides them
  by the component's ranks; DDP keeps a full replica on each. A trainer peaks either in its
  backward pass (weights, moments, activations and logits; the gradients were freed by
  ``zero_grad``) or at its optimizer step (weights, gradients, moments): the larger is its total.
* trainer activations, per layer and token, the tensors autograd keeps for the backward pass of a
  Llama-family layer, counted as Korthikanti et al. 2022 ("Reducing Activation Recomputation in
  Large Transformer Models", §4.1) count them, here for RMSNorm, grouped KV heads, a gated MLP and
  no dropout: ``e·(4h + 2q + 2kv + 4f)``, plus ``2·e·a·s`` of attention scores where attention is
  not fused (FlashAttention keeps none). Full activation checkpointing keeps each layer's input
  (``e·h``) and recomputes one layer at a time. The loss adds ``(e + 8)`` bytes per logit: the
  logits, their fp32 copy and the fp32 log-softmax.
* vLLM engine: the weights split over TP; the KV cache as vLLM sizes it (``kv_cache``).
* reference / frozen: the weights.
* every process: a fixed overhead (CUDA context, allocator slack), a named constant each
  component may override with ``overhead_gib``.
"""

import math
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field

from rlinfra.config import Section, parse
from rlinfra.placement.errors import PlacementError, short_ranks
from rlinfra.placement.model_size import ModelShape
from rlinfra.placement.record import Placement

GIB = 2**30
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
PROCESS_OVERHEAD_GIB = 1.0  # a CUDA context and the caching allocator's slack
ENGINE_OVERHEAD_GIB = 2.0  # the same, plus vLLM's profiled activations and CUDA graphs
VLLM_DEFAULT_UTILIZATION = 0.92  # vLLM 0.32's gpu_memory_utilization
LOGIT_EXTRA_BYTES = 8  # per logit: the fp32 copy and the fp32 log-softmax of the loss


class _Role(Section):
    time_shared: bool = Field(
        default=False, description="sleeps (holding only its overhead) while a colocated component works"
    )


class TrainerMemory(_Role):
    """A trained component: states, activations and the loss's logits."""

    role: Literal["trainer"]
    sharding: Literal["ddp", "fsdp"] = "ddp"
    precision: Literal["bf16-mixed", "fp32"] = "bf16-mixed"
    micro_batch: int = Field(default=1, ge=1)
    seq_len: int = Field(default=2048, ge=1, description="tokens per sequence")
    activation_checkpointing: bool = False
    flash_attention: bool = True
    overhead_gib: float = Field(default=PROCESS_OVERHEAD_GIB, ge=0)


class EngineMemory(_Role):
    """A vLLM engine: ``kv_cache_memory_bytes`` sizes its KV cache, else ``gpu_memory_utilization``
    of each device is what it takes."""

    role: Literal["engine"]
    dtype: Literal["bfloat16", "float16", "float32"] = "bfloat16"
    gpu_memory_utilization: float = Field(default=VLLM_DEFAULT_UTILIZATION, gt=0, le=1)
    kv_cache_memory_bytes: int | None = Field(default=None, ge=1)
    max_model_len: int | None = Field(default=None, ge=1, description="the model's context when not given")
    block_size: int = Field(default=16, ge=1, description="16 on GPUs (vLLM's CPU backend uses 128)")
    overhead_gib: float = Field(default=ENGINE_OVERHEAD_GIB, ge=0)


class ReferenceMemory(_Role):
    """A frozen model (reference, reward): its weights."""

    role: Literal["reference"]
    dtype: Literal["bfloat16", "float16", "float32"] = "bfloat16"
    sharding: Literal["replicated", "fsdp"] = "replicated"
    overhead_gib: float = Field(default=PROCESS_OVERHEAD_GIB, ge=0)


MemorySettings = TrainerMemory | EngineMemory | ReferenceMemory
ROLES: dict[str, type[MemorySettings]] = {
    "trainer": TrainerMemory,
    "engine": EngineMemory,
    "reference": ReferenceMemory,
}


def parse_memory(raw: Any, where: str) -> MemorySettings:
    """A component's ``memory`` mapping, checked; ``where`` is its key path."""
    role = raw.get("role") if isinstance(raw, Mapping) else None
    if role not in ROLES:
        raise PlacementError(
            f"role {role!r}" if isinstance(raw, Mapping) else f"expected a mapping, got {raw!r}",
            where=f"{where}.role",
            expected="one of " + ", ".join(repr(name) for name in ROLES),
        )
    return parse(ROLES[role], raw, where, PlacementError)


def assumptions(settings: MemorySettings) -> list[str]:
    """The settings that change memory and were not written, each with the default assumed."""
    return [
        f"{name}: {getattr(settings, name)}"
        for name in type(settings).model_fields
        if name not in settings.model_fields_set and getattr(settings, name) is not None
    ]


@dataclass(frozen=True)
class KVCache:
    """One engine process's KV cache as vLLM sizes it: ``blocks`` of ``block_size`` tokens
    (``page`` bytes per layer each), how many ``max_model_len`` requests fit at once
    (``concurrency``), the tokens vLLM logs ("KV cache size: N tokens") and, when one request does
    not fit, the longest context that would (vLLM's "estimated maximum model length")."""

    bytes: int
    blocks: int
    block_size: int
    concurrency: float
    tokens: int
    max_model_len: int
    fits_max_len: int


def kv_cache(shape: ModelShape, settings: EngineMemory, tp: int, available: int) -> KVCache:
    """vLLM 0.32's arithmetic (``kv_cache_interface``, ``kv_cache_utils``): a page holds
    ``block_size`` tokens of K and V for the rank's ``max(1, kv_heads // tp)`` heads; ``available``
    bytes make ``available // (layers × page)`` blocks, one of which is the null block held back
    when checking that one request of ``max_model_len`` fits."""
    page = (
        settings.block_size * max(1, shape.kv_heads // tp) * 2 * shape.head_dim * DTYPE_BYTES[settings.dtype]
    )
    per_block = shape.layers * page
    blocks = max(available, 0) // per_block
    length = settings.max_model_len or shape.max_positions
    concurrency = blocks / math.ceil(length / settings.block_size)
    usable = max(blocks - 1, 0) * settings.block_size
    return KVCache(
        blocks * per_block,
        blocks,
        settings.block_size,
        concurrency,
        int(concurrency * length),
        length,
        usable,
    )


@dataclass(frozen=True)
class Terms:
    """One process's bytes on each of its devices, by term, awake and asleep (time-sharing)."""

    component: str
    devices: int  # how many devices the process owns (an engine's TP), each holding ``terms``
    terms: dict[str, int]
    total: int  # the process's peak: the sum of ``terms``, a trainer's larger phase
    asleep: int | None  # None: never asleep
    kv: KVCache | None = None


def process_terms(
    component: str,
    shape: ModelShape,
    settings: MemorySettings,
    ranks: int,
    devices: int,
    device_bytes: int,
) -> Terms:
    """The bytes one process of ``component`` (``ranks`` of them, each owning ``devices``) holds
    on each of its devices of ``device_bytes``."""
    psi, overhead = shape.parameters, int(settings.overhead_gib * GIB)
    asleep, kv = overhead if settings.time_shared else None, None
    if isinstance(settings, TrainerMemory):
        terms = trainer_terms(shape, settings, ranks) | {"overhead": overhead}
        backward = terms["activations"] + terms["logits"]
        total = overhead + terms["weights"] + terms["optimizer"] + max(terms["gradients"], backward)
        return Terms(component, devices, terms, total, asleep)
    if isinstance(settings, ReferenceMemory):
        shards = ranks if settings.sharding == "fsdp" else 1
        terms = {"weights": psi * DTYPE_BYTES[settings.dtype] // shards, "overhead": overhead}
    else:
        weights = psi * DTYPE_BYTES[settings.dtype] // max(devices, 1)
        if settings.kv_cache_memory_bytes is not None:
            available = settings.kv_cache_memory_bytes
        else:
            available = math.ceil(device_bytes * settings.gpu_memory_utilization) - weights - overhead
        kv = kv_cache(shape, settings, max(devices, 1), available)
        terms = {"weights": weights, "kv_cache": max(available, 0), "overhead": overhead}
    return Terms(component, devices, terms, sum(terms.values()), asleep, kv)


def trainer_terms(shape: ModelShape, settings: TrainerMemory, ranks: int) -> dict[str, int]:
    """States, activations and logits of one trainer rank (the module docstring's formulas)."""
    psi = shape.parameters
    e = 2 if settings.precision == "bf16-mixed" else 4
    shards = ranks if settings.sharding == "fsdp" else 1
    tokens = settings.micro_batch * settings.seq_len
    q, kv = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    per_token = 4 * shape.hidden + 2 * q + 2 * kv + 4 * shape.intermediate
    if not settings.flash_attention:
        per_token += 2 * shape.heads * settings.seq_len
    layer = e * tokens * per_token
    kept = (
        shape.layers * e * tokens * shape.hidden + layer
        if settings.activation_checkpointing
        else shape.layers * layer
    )
    return {
        "weights": 4 * psi // shards,
        "gradients": 4 * psi // shards,
        "optimizer": 8 * psi // shards,
        "activations": kept,
        "logits": tokens * shape.vocab * (e + LOGIT_EXTRA_BYTES),
    }


@dataclass(frozen=True)
class DeviceMemory:
    """Devices with the same prediction (``devices``: (node, device) pairs): what each process
    holds on one of them, the bytes of each phase (``all`` when nothing takes turns; else one
    phase per time-shared component awake, the others asleep), and the peak against ``capacity``."""

    devices: tuple[tuple[int, int], ...]
    capacity: int
    held: tuple[Terms, ...]
    phases: dict[str, int]

    @property
    def peak_phase(self) -> str:
        return max(self.phases, key=self.phases.__getitem__)

    @property
    def peak(self) -> int:
        return self.phases[self.peak_phase]

    @property
    def fits(self) -> bool:
        return self.peak <= self.capacity

    @property
    def where(self) -> str:
        """``node 0 device 3``, ``node 0 devices 0-7``, ``nodes 0-999 devices 0-7`` or a list."""
        by_node: dict[int, list[int]] = defaultdict(list)
        for node, device in self.devices:
            by_node[node].append(device)
        lists = {tuple(devices) for devices in by_node.values()}
        if len(lists) > 1:
            return "; ".join(
                f"node {node} devices {short_ranks(devices)}" for node, devices in by_node.items()
            )
        nodes, devices = list(by_node), lists.pop()
        return (
            f"node{'s' * (len(nodes) > 1)} {short_ranks(nodes)} device{'s' * (len(devices) > 1)} "
            + short_ranks(devices)
        )


def device_memory(devices: Sequence[tuple[int, int]], capacity: int, held: Sequence[Terms]) -> DeviceMemory:
    """The phases of one device shared by ``held``: time-shared processes take turns, awake one
    component at a time; the others hold their full amount throughout."""
    sharing = sorted({t.component for t in held if t.asleep is not None})
    if not sharing:
        phases = {"all": sum(t.total for t in held)}
    else:
        phases = {
            f"{awake} awake": sum(
                t.total if t.asleep is None or t.component == awake else t.asleep for t in held
            )
            for awake in sharing
        }
    return DeviceMemory(tuple(devices), capacity, tuple(held), phases)


@dataclass(frozen=True)
class Declared:
    """A component's memory declaration with what its processes hold it with: the model's shape,
    its ranks (the shard count of FSDP), and each process's devices."""

    settings: MemorySettings
    shape: ModelShape
    ranks: int

    def terms(self, component: str, devices: int, device_bytes: int, **change: Any) -> Terms:
        settings = self.settings.model_copy(update=change) if change else self.settings
        return process_terms(component, self.shape, settings, self.ranks, devices, device_bytes)


def plan_devices(
    placements: Mapping[str, Sequence[Placement]],
    declared: Mapping[str, Declared],
    capacity: Callable[[int], int],
) -> list[DeviceMemory]:
    """Every accelerator that a declared component's process holds, devices with the same
    prediction together; ``capacity(node)`` is the bytes of each accelerator of that node. Each
    component's terms are computed once per TP size and device size: planning 8,000 devices
    costs little more than placing them."""
    held: dict[int, dict[int, list[Terms]]] = defaultdict(lambda: defaultdict(list))
    made: dict[tuple[str, int, int], Terms] = {}  # per component, TP size and device size
    for name, spec in declared.items():
        last: tuple[int, int] | None = None
        for _, _, node, _, _, _, accelerator, _, _, _, kind, _, devices, _ in placements[name]:  # fast
            if kind != accelerator:
                continue  # a process on CPUs, whole nodes or custom hardware holds no accelerator
            if (node, len(devices)) != last:  # records come node by node: look up once per node
                last, on_node = (node, len(devices)), held[node]
                size = (name, len(devices), capacity(node))
                terms = made.get(size) or made.setdefault(size, spec.terms(*size))
            for device in devices:
                on_node[device].append(terms)
    same: dict[tuple[Any, ...], list[tuple[int, int]]] = defaultdict(list)
    for node, on_node in held.items():
        for device, terms_held in on_node.items():
            same[tuple(map(id, terms_held))].append((node, device))
    groups = sorted(sorted(pairs) for pairs in same.values())
    return [device_memory(pairs, capacity(pairs[0][0]), held[pairs[0][0]][pairs[0][1]]) for pairs in groups]


def check_engines(devices: list[DeviceMemory], where: str) -> None:
    """Refuse, as vLLM would at its start, an engine whose KV cache cannot hold one request of
    ``max_model_len`` (or holds nothing at all)."""
    for device in devices:
        for held in device.held:
            kv = held.kv
            if kv is None or kv.fits_max_len >= kv.max_model_len:
                continue
            fix = f"max_model_len <= {kv.fits_max_len}" if kv.fits_max_len else "more memory for the KV cache"
            raise PlacementError(
                f"{held.component} on {device.where}: a KV "
                f"cache of {kv.bytes / GIB:.2f} GiB holds {kv.blocks} blocks of {kv.block_size} tokens, "
                f"less than one request of max_model_len {kv.max_model_len}",
                where=f"{where}.{held.component}.memory",
                expected=f"{fix}, a larger gpu_memory_utilization or kv_cache_memory_bytes, or a larger TP",
            )


def refuse_overfull(device: DeviceMemory, declared: Mapping[str, Declared], where: str) -> PlacementError:
    """The error for a device whose peak exceeds its capacity: the phase, the largest terms, the
    shortfall, and each single change that would make the device fit."""
    phase = device.peak_phase
    awake = [t for t in device.held if t.asleep is None or phase in ("all", f"{t.component} awake")]
    largest = sorted(((v, f"{t.component} {k}") for t in awake for k, v in t.terms.items()), reverse=True)[:3]
    short = (device.peak - device.capacity) / GIB
    return PlacementError(
        f"{device.where}: phase '{phase}' needs {device.peak / GIB:.1f} GiB of "
        f"{device.capacity / GIB:.1f} GiB (short by {short:.1f} GiB); largest: "
        + ", ".join(f"{name} {value / GIB:.1f} GiB" for value, name in largest),
        where=where,
        expected="a plan that fits, e.g. " + "; ".join(_fixes(device, declared) or ["more devices"]),
    )


def _fixes(device: DeviceMemory, declared: Mapping[str, Declared]) -> list[str]:
    """Single changes to one component on ``device`` after which it fits."""
    fixes: list[str] = []
    for held in device.held:
        spec, name = declared[held.component], held.component
        settings = spec.settings
        if (
            isinstance(settings, TrainerMemory | ReferenceMemory)
            and settings.sharding != "fsdp"
            and _fits_with(device, held, spec, sharding="fsdp")
        ):
            fixes.append(f"{name}: FSDP over its {spec.ranks} ranks instead of {settings.sharding}")
        if isinstance(settings, TrainerMemory):
            if not settings.activation_checkpointing and _fits_with(
                device, held, spec, activation_checkpointing=True
            ):
                fixes.append(f"{name}: activation_checkpointing: true")
            smaller = (m for m in range(settings.micro_batch - 1, 0, -1))
            batch = next((m for m in smaller if _fits_with(device, held, spec, micro_batch=m)), None)
            if batch is not None:
                fixes.append(f"{name}: micro_batch <= {batch}")
        if isinstance(settings, EngineMemory) and settings.kv_cache_memory_bytes is None:
            lower = (u / 100 for u in range(round(settings.gpu_memory_utilization * 100) - 1, 0, -1))
            util = next((u for u in lower if _fits_with(device, held, spec, gpu_memory_utilization=u)), None)
            if util is not None:
                fixes.append(f"{name}: gpu_memory_utilization <= {util:.2f}")
    return fixes


def _fits_with(device: DeviceMemory, held: Terms, spec: Declared, **change: Any) -> bool:
    """Whether ``device`` fits once ``held``'s component is changed by ``change`` (an engine must
    also still hold one request)."""
    changed = spec.terms(held.component, held.devices, device.capacity, **change)
    others = [changed if terms is held else terms for terms in device.held]
    kv = changed.kv
    serves = kv is None or kv.fits_max_len >= kv.max_model_len
    return serves and device_memory(device.devices, device.capacity, others).fits
