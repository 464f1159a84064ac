"""What an :class:`~kvckpt_web.engine.Engine` is built with: one frozen, checked :class:`EngineConfig`, and its
named presets (:data:`PRESETS`): ``desktop`` for ``kvckpt generate``, ``kvckpt chat`` and ``kvckpt serve --api``,
``browser`` for the page's engine (``createEngine()``). A front end starts from its preset and replaces the fields
its flags or options give (:meth:`EngineConfig.replace`).

Determinism: a reply's prompt is prefilled ``prefill_chunk`` tokens per forward, in chunks that end at multiples
of it, and every checkpoint saves that chunk with the reply (``app_state.prefill_chunk``); a resume splits what
it runs again at the same multiples, so it gives the tokens an uninterrupted run gives whatever the resuming
engine's own chunk, which must be at least the saved one (a FieldError naming ``prefill_chunk`` otherwise).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from ..checks import check_int
from ..durable.retention import DEFAULT_KEEP
from ..errors import FieldError
from ..model.caches import PAGE_SIZE, PREFILL_CHUNK

__all__ = ["EngineConfig", "PRESETS"]


@dataclass(frozen=True)
class EngineConfig:
    """An engine's settings, each checked when the config is made (a FieldError naming the field, what it must be
    and what it is).

    ``context`` bounds each conversation, prompt and reply (the model's own context if smaller); the cache holds
    ``sequences`` conversations and ``cache_tokens`` tokens in all (None: twice the context) in pages of
    ``page_size`` tokens; prompts are prefilled ``prefill_chunk`` tokens per forward; a reply is saved every
    ``autosave_every`` tokens, ``keep`` generations are kept, and checkpoints cut each layer into chunks of
    ``chunk_tokens`` tokens, small enough that conversations sharing a prefix share its chunks. A reply whose
    request gives no ``max_tokens`` stops after ``max_tokens`` tokens (or at the end of the context, if sooner):
    never an unbounded reply filling a store.
    """

    context: int = 4096
    sequences: int = 4
    cache_tokens: int | None = None
    page_size: int = PAGE_SIZE
    prefill_chunk: int = PREFILL_CHUNK
    autosave_every: int = 32
    keep: int = DEFAULT_KEEP
    chunk_tokens: int = 256
    max_tokens: int = 1024

    def __post_init__(self) -> None:
        check_int("context", self.context, 2)
        for name in ("sequences", "page_size", "prefill_chunk", "autosave_every", "keep", "chunk_tokens",
                     "max_tokens"):
            check_int(name, getattr(self, name), 1)
        if self.cache_tokens is not None:
            check_int("cache_tokens", self.cache_tokens, self.context)

    @classmethod
    def preset(cls, name: str) -> "EngineConfig":
        """The preset ``name`` (a key of :data:`PRESETS`); FieldError naming ``preset`` if there is none."""
        if name not in PRESETS:
            raise FieldError("preset", f"one of {sorted(PRESETS)}", name)
        return PRESETS[name]

    def replace(self, **fields: Any) -> "EngineConfig":
        """This config with ``fields`` replaced (a None value keeps the field as it is), checked again;
        FieldError naming a field there is none of."""
        known = {f.name for f in dataclasses.fields(self)}
        for name in fields:
            if name not in known:
                raise FieldError(name, f"one of the engine's settings {sorted(known)}", "an unknown setting")
        return dataclasses.replace(self, **{k: v for k, v in fields.items() if v is not None})

    def fitted(self, max_context: int) -> "EngineConfig":
        """What an engine over a model of ``max_context`` tokens runs with: the context no more than the model's,
        and the cache's tokens given (twice the context unless told)."""
        context = min(max_context, self.context)
        return dataclasses.replace(self, context=context,
                                   cache_tokens=2 * context if self.cache_tokens is None else self.cache_tokens)

    @property
    def pages_per_chunk(self) -> int:
        """Pages of a layer in one chunk of a checkpoint (``chunk_tokens`` in pages, at least one)."""
        return max(1, self.chunk_tokens // self.page_size)

    def to_json(self) -> dict[str, Any]:
        """The settings as a JSON object (what :meth:`replace` takes back)."""
        return dataclasses.asdict(self)


PRESETS: dict[str, EngineConfig] = {
    "desktop": EngineConfig(),
    "browser": EngineConfig(context=1024, prefill_chunk=64, autosave_every=16),
}
"""The named configs: ``desktop`` (the CLI's commands), ``browser`` (a page's engine: a smaller context, shorter
forwards, which keep a browser's GPU queue responsive, and more frequent saves, as a tab is closed at any time)."""
