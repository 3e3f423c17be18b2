"""A receiver's weights: one version per ``Buffers``, double-buffered by ``DoubleBuffers``.

Generation reads *current*; an update fills *shadow* meanwhile, and the swap makes it current in
O(1); the version before stays as *previous*, for rollback, until the next update begins and
reuses its memory as its own shadow. ``Buffers`` keeps a version in this process's memory; a
transport that keeps it elsewhere (a GPU, the node's object store) subclasses it in its module.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from rlinfra.services.weights.buckets import Manifest, checksum, pack, unpack
from rlinfra.services.weights.gate import Gate

# Shared weights' checks: node id -> bucket index -> (object id, checksum of the object's bytes).
NodeChecks = Mapping[str, Mapping[int, tuple[str, int]]]


class WeightsSwapError(RuntimeError):
    """The staged version cannot be made current (not fully staged, or the gate is not ours)."""


class WeightsVerifyError(ValueError):
    """The weights a worker serves are not the version, or not the bytes, the trainer sent."""


@dataclass(frozen=True)
class Expected:
    """What verify holds a receiver to: the version, the sender's checksum of every bucket (none
    with ``checksums=False``), and for shared weights what each node hashed."""

    version: int
    checksums: Mapping[int, int]
    node_checks: NodeChecks | None = None


@dataclass(frozen=True)
class WeightsView:
    """The weights a piece of generation uses: its version and tensors (read-only views)."""

    version: int
    tensors: Mapping[str, Any]


@dataclass
class Buffers:
    """One version in this process's memory: a numpy uint8 array per bucket, checksummed as
    received (unless the manifest says it is not hashed: ``WeightSync(checksums=False)``)."""

    version: int
    manifest: Manifest  # the bucket layout (none for initial weights given in-process), whether hashed
    buckets: list[Any] = field(default_factory=list)
    checksums: dict[int, int] = field(default_factory=dict)
    tensors: Mapping[str, Any] = field(default_factory=dict)
    views: ClassVar[Callable[..., dict[str, Any]]] = staticmethod(unpack)  # tensors from one bucket

    def allocate(self, spare: Buffers | None) -> None:
        """Buckets for the manifest: ``spare``'s memory where it has the same kind and layout
        (double buffering: the last-but-one version's), else new ones."""
        sizes = [spec.nbytes for spec in self.manifest.buckets]
        if type(spare) is type(self) and [spec.nbytes for spec in spare.manifest.buckets] == sizes:
            self.buckets = spare.buckets
        else:
            self.buckets = [self.new_bucket(size) for size in sizes]

    def fill(self, state: Mapping[str, Any]) -> Buffers:
        """New buckets for the manifest, filled with ``state``'s tensors and checksummed; returns self."""
        self.allocate(None)
        for spec, bucket in zip(self.manifest.buckets, self.buckets, strict=True):
            self.checksums[spec.index] = pack(state, spec, out=bucket)[1]
        return self

    def new_bucket(self, nbytes: int) -> Any:
        return np.empty(nbytes, dtype=np.uint8)

    def digest(self, index: int) -> int:
        """The checksum of bucket ``index``'s bytes as they are now."""
        return checksum(self.buckets[index])

    def build_views(self, as_torch: bool) -> None:
        """The tensors, as views of the buckets, built before the swap so that it is O(1)."""
        tensors: dict[str, Any] = {}
        for spec, bucket in zip(self.manifest.buckets, self.buckets, strict=True):
            if bucket is None:
                raise RuntimeError(f"version {self.version}: bucket {spec.index} never arrived")
            tensors.update(self.views(bucket, spec, as_torch=as_torch))
        self.tensors = tensors

    def adopt_checks(self, expected: Expected) -> list[str]:
        """Take the checksums made for this process elsewhere, and say what does not hold the very
        bytes that were checked. Private buffers hashed what they hold themselves: nothing to say."""
        return []


@dataclass(frozen=True)
class BucketFile:
    """Where another process of this node maps one bucket: ``/proc/<pid>/fd/<fd>``, ``nbytes`` long."""

    path: str
    nbytes: int


class _MemoryFile:
    """An anonymous in-memory file (``memfd``) and this process's writable mapping of it. The
    kernel frees it with its last reference: a process killed mid-update leaves nothing behind
    (a file in ``/dev/shm`` would stay)."""

    def __init__(self, nbytes: int) -> None:
        self.fd = os.memfd_create("rlinfra-bucket", os.MFD_CLOEXEC)
        os.ftruncate(self.fd, max(nbytes, 1))
        self.array = np.frombuffer(mmap.mmap(self.fd, max(nbytes, 1)), dtype=np.uint8, count=nbytes)
        self.file = BucketFile(f"/proc/{os.getpid()}/fd/{self.fd}", nbytes)

    def __del__(self) -> None:
        os.close(self.fd)


@dataclass
class MappableBuffers(Buffers):
    """Private host buffers that other processes of this node can map (``files``): an engine
    whose parameters live in worker processes of its own (vLLM's, one per tensor-parallel rank)
    loads a version from them without a copy through a pipe or a pickle."""

    memory: list[_MemoryFile] = field(default_factory=list)

    def allocate(self, spare: Buffers | None) -> None:
        sizes = [spec.nbytes for spec in self.manifest.buckets]
        if isinstance(spare, MappableBuffers) and [m.file.nbytes for m in spare.memory] == sizes:
            self.memory = spare.memory
        else:
            self.memory = [_MemoryFile(size) for size in sizes]
        self.buckets = [memory.array for memory in self.memory]

    @property
    def files(self) -> list[BucketFile]:
        return [memory.file for memory in self.memory]


class DoubleBuffers:
    """A receiver's ``current``, ``shadow`` and ``previous``, and the gate generation passes
    through; they change only under the gate's lock (``with buffers:`` holds it)."""

    def __init__(self, initial: Buffers) -> None:
        self.gate = Gate()
        self.current = initial
        self.shadow: Buffers | None = None
        self.previous: Buffers | None = None

    def __enter__(self) -> DoubleBuffers:
        self.gate.lock.acquire()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.gate.lock.release()

    def staged(self, owner: str, version: int) -> Buffers:
        """The shadow, for a swap by ``owner``: the gate must be ``owner``'s and ``version`` fully staged."""
        if self.gate.paused_by != owner:
            raise WeightsSwapError(f"the update gate is held by {self.gate.paused_by!r}, not {owner!r}")
        shadow = self.shadow
        if shadow is None or shadow.version != version or not shadow.tensors:
            raise WeightsSwapError(f"version {version} is not fully staged here")
        return shadow

    def swap(self, owner: str, version: int) -> None:
        """Make the shadow current (O(1)); keep the old current for rollback."""
        self.previous, self.current, self.shadow = self.current, self.staged(owner, version), None

    def rollback(self, version: int) -> None:
        """Undo a swap to ``version`` (no-op if it did not happen); drop any staged shadow."""
        self.shadow = None
        if self.current.version == version and self.previous is not None:
            self.current, self.previous = self.previous, self.current

    def verify(self, expected: Expected) -> None:
        """Check the version serving now and the checksum of every bucket as received."""
        elsewhere = self.current.adopt_checks(expected)  # first: shared weights take their node's checksums
        check_holds("verify", self.current, expected, elsewhere)


def check_holds(step: str, held: Buffers, expected: Expected, others: Sequence[str] = ()) -> None:
    """Raise ``WeightsVerifyError`` (``<step> failed: ...``) unless ``held`` is the expected version
    and, where the sender checksummed it, hashed to exactly the sender's checksums (a bucket
    without one on either side differs too). A version sent without checksums is checked by its
    number alone, whatever ``held`` hashed. ``others`` are problems the caller found."""
    problems = []
    if held.version != expected.version:
        problems.append(f"holds version {held.version} (expected {expected.version})")
    sent, got = expected.checksums, held.checksums
    compared = sent.keys() | got.keys() if sent else ()
    mismatched = sorted(i for i in compared if got.get(i) != sent.get(i))
    if mismatched:
        problems.append(f"checksum mismatch in bucket(s) {mismatched[:8]}")
    problems.extend(others)
    if problems:
        raise WeightsVerifyError(f"{step} failed: " + "; ".join(problems))
