"""What the durable operations return: the results of save, restore and gc, a listing's entries, verify's
report, and the progress callback they take."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .prefix_records import PrefixRecord

__all__ = ["GcResult", "GenerationInfo", "Progress", "RestoreResult", "SaveResult", "SyncResult", "VerifyReport"]

#: ``progress(phase, done, total)``: called as a long operation advances.
Progress = Callable[[str, int, int], None]


@dataclass(frozen=True)
class SaveResult:
    """What one :func:`~kvckpt_web.durable.save.save` did."""

    name: str
    generation: int
    key: str
    seq_id: int
    seq_length: int
    num_chunks: int
    """Chunks the new manifest references (all groups)."""
    chunks_written: int
    """Chunks this save stored (the others were unchanged or already in the store)."""
    bytes_written: int
    """Payload bytes this save stored: new chunks, the manifest and its prefix index record."""
    pages_read: int
    """Logical pages per group read back from the GPU."""
    deleted_manifests: tuple[str, ...] = ()
    deleted_chunks: int = 0
    warnings: tuple[str, ...] = ()
    """What went wrong without failing the save: chunks it found damaged and rewrote, damaged manifests it
    kept, a failed clean-up after the commit."""
    seconds: float = 0.0
    """Wall time the save took, waiting for the store lock included."""
    prefix_record: "PrefixRecord | None" = None
    """The prefix index record the save committed (``prefix=``), for ``PrefixIndex.note``; None without one or
    if it could not be written (a warning says why)."""


@dataclass(frozen=True)
class RestoreResult:
    """What one :func:`~kvckpt_web.durable.restore.restore` loaded."""

    name: str
    generation: int
    key: str
    seq_id: int
    seq_length: int
    app_state: dict[str, Any]
    num_chunks: int
    nbytes: int
    """Bytes of page-group data imported (all groups)."""


@dataclass(frozen=True)
class GenerationInfo:
    """One manifest in a store, as :func:`~kvckpt_web.durable.catalog.list_generations` found it."""

    name: str
    generation: int
    key: str
    manifest_bytes: int
    error: str | None = None
    """Why the manifest cannot be used; None if it decodes and matches its key."""
    created_ms: int | None = None
    seq_id: int | None = None
    seq_length: int | None = None
    num_groups: int | None = None
    num_logical_pages: int | None = None
    pages_per_chunk: int | None = None
    chunk_keys: tuple[str, ...] = ()
    """Every chunk key of the manifest, group by group (repeats kept)."""
    chunk_nbytes: tuple[int, ...] = ()
    """The size of each chunk of ``chunk_keys``."""
    nbytes: int = 0
    """Page-group bytes the checkpoint holds (all groups)."""
    app_state: dict[str, Any] | None = None


@dataclass(frozen=True)
class GcResult:
    """What :func:`~kvckpt_web.durable.retention.gc` kept and deleted."""

    kept_manifests: tuple[str, ...]
    deleted_manifests: tuple[str, ...]
    deleted_chunks: int
    freed_bytes: int
    damaged_manifests: tuple[str, ...] = ()
    """Kept manifests that could not be read; while any is kept, no chunk is deleted."""
    kept_reasons: dict[str, str] = field(default_factory=dict)
    """Why each kept manifest was kept (restorable and among the newest ``keep``, damaged and newer than
    those, or not collected)."""
    deleted_records: int = 0
    """Prefix index records deleted: those of the manifests deleted, and any other whose manifest is gone."""


@dataclass
class VerifyReport:
    """What :func:`~kvckpt_web.durable.verify.verify` checked and found; ``ok`` only if nothing is wrong."""

    manifests_checked: list[str] = field(default_factory=list)
    chunks_checked: int = 0
    bytes_checked: int = 0
    loaded: list[str] = field(default_factory=list)
    """Manifests restored into a GPU cache and read back identical."""
    unreferenced_chunks: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    """What is amiss without damaging a checkpoint: prefix index records that lookups ignore or whose
    checkpoint is gone."""

    @property
    def ok(self) -> bool:
        """True if every manifest and chunk is intact (unreferenced chunks are not a problem)."""
        return not self.problems


@dataclass(frozen=True)
class SyncResult:
    """What one :func:`~kvckpt_web.durable.sync.sync` did."""

    copied: tuple[str, ...]
    """The manifest keys it copied (each name's newest generation that the destination lacked; under a name of
    its own for a name in ``kept_apart``)."""
    up_to_date: tuple[str, ...]
    """The manifest keys the destination held already (their missing prefix index records were copied)."""
    conflicts: tuple[str, ...]
    """One line per name not copied because the destination holds a generation that goes on from it."""
    chunks_sent: int
    """Chunks written to the destination."""
    chunks_present: int
    """Chunks the copied manifests use that the destination held already (not moved)."""
    records_sent: int
    """Prefix index records written to the destination."""
    bytes_sent: int
    """Payload bytes written to the destination: chunks, manifests and records."""
    seconds: float
    kept_apart: dict[str, str] = field(default_factory=dict)
    """Per name whose copy went apart from the destination's (another history or another conversation under
    the name): the name the destination holds the copy under, beside its own (``<name>.apart-<id>``, see
    :func:`~kvckpt_web.durable.sync.apart_name`); the copy's key is in ``copied`` or ``up_to_date``."""
