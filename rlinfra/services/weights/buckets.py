"""Flat per-dtype buckets of a state dict, each with a checksum.

Weights move as a few large contiguous buffers instead of hundreds of small tensors: one
``ray.put`` or one collective per bucket, and memory in flight bounded by the bucket size. Every
bucket carries an xxh3 checksum computed by the sender, so a receiver verifies the bytes it got,
not a success flag (prime-rl and AReaL "verify" with a flag or a marker file).

Tensors are torch tensors or numpy arrays; buckets are 1-D numpy uint8 views of the packed bytes,
so any transport can carry them and checksums are computed on exactly what travelled.
"""

import functools
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import xxhash

DEFAULT_BUCKET_BYTES = 64 * 2**20
COPY_CHUNK_BYTES = 2**20  # well inside L2, large enough that the per-chunk overhead is negligible


@dataclass(frozen=True)
class Entry:
    """One tensor inside a bucket: where its bytes start and how to view them again."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int


@dataclass(frozen=True)
class BucketSpec:
    """What a bucket holds, known from shapes and dtypes alone (before any byte is packed)."""

    index: int
    nbytes: int
    entries: tuple[Entry, ...]


@dataclass(frozen=True)
class Manifest:
    """The version, its bucket layout (what a receiver allocates its shadow buffers from) and
    whether its buckets are checksummed. The checksums travel separately, computed by the sender
    as it packs each bucket; ``hashed`` belongs to the version, so every side of one update hashes
    or none does, whatever the next update chooses."""

    version: int
    buckets: tuple[BucketSpec, ...]
    hashed: bool = True

    @property
    def nbytes(self) -> int:
        return sum(bucket.nbytes for bucket in self.buckets)


def checksum(buffer: np.ndarray) -> int:
    return xxhash.xxh3_64_intdigest(np.ascontiguousarray(buffer).data.cast("B"))


def as_numpy(tensor: Any) -> np.ndarray:
    """A numpy view (no copy where possible) of a torch tensor or numpy array, on the CPU."""
    if hasattr(tensor, "detach"):  # torch.Tensor, without importing torch for numpy users
        tensor = tensor.detach().cpu()  # no copy for a tensor on the CPU already
        if str(tensor.dtype) == "torch.bfloat16":  # numpy has no bfloat16: carry the raw bits
            return tensor.view(dtype=_torch().int16).numpy().view(np.uint16)
        return tensor.numpy()
    return np.asarray(tensor)


def _torch() -> Any:
    import torch

    return torch


def tensor_meta(tensor: Any) -> tuple[str, tuple[int, ...], int]:
    """``(dtype key, shape, nbytes)`` from metadata alone: planning copies no tensor."""
    if hasattr(tensor, "detach") and hasattr(tensor, "element_size"):  # torch.Tensor
        key = "bfloat16" if str(tensor.dtype) == "torch.bfloat16" else _numpy_key(tensor.dtype)
        return key, tuple(tensor.shape), tensor.numel() * tensor.element_size()
    array = as_numpy(tensor)
    return array.dtype.str, tuple(array.shape), array.nbytes


@functools.cache
def _numpy_key(torch_dtype: Any) -> str:
    """The numpy dtype string a CPU tensor of ``torch_dtype`` would have (``as_numpy`` agrees)."""
    return _torch().empty(0, dtype=torch_dtype).numpy().dtype.str


@functools.cache
def torch_dtype(key: str) -> Any:
    """The torch dtype of a bucket entry's dtype key (inverse of ``tensor_meta``'s key)."""
    torch = _torch()
    return torch.bfloat16 if key == "bfloat16" else torch.from_numpy(np.empty(0, dtype=key)).dtype


def plan_buckets(
    state: Mapping[str, Any], bucket_bytes: int = DEFAULT_BUCKET_BYTES
) -> tuple[BucketSpec, ...]:
    """Lay tensors out in buckets: same dtype, in state-dict order, at most ``bucket_bytes`` each
    (a larger tensor gets a bucket of its own). No bytes are copied."""
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes must be positive, got {bucket_bytes}")
    open_buckets: dict[str, list[Entry]] = {}
    done: list[list[Entry]] = []
    for name, tensor in state.items():
        key, shape, nbytes = tensor_meta(tensor)
        entries = open_buckets.setdefault(key, [])
        used = entries[-1].offset + entries[-1].nbytes if entries else 0
        if entries and used + nbytes > bucket_bytes:
            done.append(entries)
            entries = open_buckets[key] = []
            used = 0
        entries.append(Entry(name, key, shape, used, nbytes))
    done.extend(entries for entries in open_buckets.values() if entries)
    return tuple(
        BucketSpec(index, entries[-1].offset + entries[-1].nbytes, tuple(entries))
        for index, entries in enumerate(done)
    )


def bucket_views(state: Mapping[str, Any], spec: BucketSpec) -> list[np.ndarray]:
    """The bucket's tensors as contiguous 1-D uint8 arrays (views, no copy where possible)."""
    return [np.ascontiguousarray(as_numpy(state[e.name])).reshape(-1).view(np.uint8) for e in spec.entries]


def arrays_checksum(arrays: list[np.ndarray]) -> int:
    """The checksum of the arrays' bytes one after the other: ``pack``'s, without packing."""
    digest = xxhash.xxh3_64()
    for array in arrays:
        digest.update(array.data)
    return digest.intdigest()


def copy_and_hash(target: np.ndarray, source: np.ndarray, digest: Any, chunk: int = COPY_CHUNK_BYTES) -> None:
    """``target[:] = source`` (both 1-D uint8), feeding ``digest`` (unless None: a copy only) with
    each chunk of ``target`` right after it lands: the received bytes are hashed while still in
    cache, one pass over memory instead of two (copy, then hash). On the 2-core test machine that
    is about 18 % faster than ``np.copyto`` then ``checksum`` for a 32 MiB bucket."""
    for start in range(0, target.nbytes, chunk):
        landed = target[start : start + chunk]
        np.copyto(landed, source[start : start + chunk])
        if digest is not None:
            digest.update(landed.data)


def pack(
    state: Mapping[str, Any], spec: BucketSpec, out: np.ndarray | None = None, hashed: bool = True
) -> tuple[np.ndarray, int]:
    """Copy the bucket's tensors into one contiguous uint8 buffer; return it and its checksum
    (0 when not ``hashed``)."""
    buffer = np.empty(spec.nbytes, dtype=np.uint8) if out is None else out
    for entry, flat in zip(spec.entries, bucket_views(state, spec), strict=True):
        buffer[entry.offset : entry.offset + entry.nbytes] = flat
    return buffer, checksum(buffer) if hashed else 0


def unpack(buffer: Any, spec: BucketSpec, as_torch: bool = False) -> dict[str, Any]:
    """Views of the tensors inside ``buffer`` (no copy); torch tensors when ``as_torch``. A torch
    uint8 ``buffer`` (e.g. a shadow bucket on a GPU) always gives torch views on its device."""
    pieces = [buffer[entry.offset : entry.offset + entry.nbytes] for entry in spec.entries]
    if isinstance(buffer, np.ndarray):
        return unpack_arrays(pieces, spec, as_torch)
    pairs = zip(spec.entries, pieces, strict=True)
    return {entry.name: piece.view(torch_dtype(entry.dtype)).reshape(entry.shape) for entry, piece in pairs}


def unpack_arrays(arrays: list[np.ndarray], spec: BucketSpec, as_torch: bool = False) -> dict[str, Any]:
    """Like ``unpack``, for a bucket that arrived as one uint8 array per tensor (the object store
    carries ``bucket_views``' list as it is). Read-only arrays (Ray's zero-copy views of the
    object store) stay read-only under numpy; torch has no read-only tensors, so its views must
    not be written to (they are shared with every worker on the node)."""
    check_arrays(arrays, spec)
    pairs = zip(spec.entries, arrays, strict=True)
    return {entry.name: _typed_view(array, entry, as_torch) for entry, array in pairs}


def check_arrays(arrays: list[np.ndarray], spec: BucketSpec) -> None:
    """Raise ``ValueError`` unless ``arrays`` has one array of the right size per entry."""
    if len(arrays) != len(spec.entries):
        raise ValueError(f"bucket {spec.index}: got {len(arrays)} tensors, expected {len(spec.entries)}")
    for entry, array in zip(spec.entries, arrays, strict=True):
        if array.nbytes != entry.nbytes:
            raise ValueError(f"{entry.name}: got {array.nbytes} bytes, expected {entry.nbytes}")


def _typed_view(raw: np.ndarray, entry: Entry, as_torch: bool) -> Any:
    """``raw`` (1-D uint8) seen as the entry's dtype and shape, as numpy or torch, without a copy
    (numpy has no bfloat16: its bits are carried as uint16, and as int16 into torch)."""
    bfloat16 = entry.dtype == "bfloat16"
    array = raw.view(np.uint16 if bfloat16 else entry.dtype).reshape(entry.shape)
    if not as_torch:
        return array
    torch = _torch()
    with warnings.catch_warnings():  # a read-only array is read-only by design: see unpack_arrays
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        tensor = torch.from_numpy(array.view(np.int16) if bfloat16 else array)
    return tensor.view(torch.bfloat16) if bfloat16 else tensor
