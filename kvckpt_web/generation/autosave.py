"""Where and how often a generation saves itself (:class:`Autosave`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..checks import check_instance, check_int
from ..durable.keys import validate_name
from ..durable.ledger import Ledger, ledger_for
from ..stores.base import check_store

if TYPE_CHECKING:
    from ..stores.base import Store

__all__ = ["Autosave", "DEFAULT_AUTOSAVE_EVERY"]

DEFAULT_AUTOSAVE_EVERY = 64
"""Tokens between two autosaves of a new generation that does not say."""


@dataclass(frozen=True)
class Autosave:
    """Where and how often a generation saves itself."""

    store: "Store"
    name: str
    every: int | None = None
    """Save once this many tokens were added to the cache since the last save or failed try (prefill
    included); None: the checkpoint's interval when resumed, else :data:`DEFAULT_AUTOSAVE_EVERY`."""
    keep: int | None = None
    """Generations of ``name`` to keep; None: the checkpoint's when resumed, else
    :data:`~kvckpt_web.durable.retention.DEFAULT_KEEP`."""
    pages_per_chunk: int | None = None
    """Pages per chunk of its checkpoints (None: the save's default, about 1 MiB)."""
    prefix_scope: str | None = None
    """If given, each save indexes the checkpoint's tokens in the store's prefix index under this scope
    (:class:`~kvckpt_web.durable.prefix_records.PrefixKey`), so other conversations can find its K/V."""
    ledger: Ledger | None = None
    """What its saves remember of the store (:class:`~kvckpt_web.durable.ledger.Ledger`), so that each writes
    only what changed since the last; None: the store object's own."""

    def __post_init__(self) -> None:
        check_store(self.store, "autosave.store")
        if self.ledger is not None:
            ledger_for(self.store, self.ledger, "autosave.ledger")
        validate_name(self.name)
        if self.every is not None:
            check_int("autosave.every", self.every, 1)
        if self.keep is not None:
            check_int("autosave.keep", self.keep, 1)
        if self.pages_per_chunk is not None:
            check_int("autosave.pages_per_chunk", self.pages_per_chunk, 1)
        if self.prefix_scope is not None:
            check_instance("autosave.prefix_scope", self.prefix_scope, str, "a str or None")
