"""Caches for a model: one of its layout and limits (:func:`new_cache`), the context a generation has in one
(:func:`context_of`), and the prefill chunks it can take (:func:`check_chunk`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..checks import check_instance, check_int
from ..errors import FieldError
from ..kv.cache import PagedKVCache
from ..tvm.layout import CacheLimits
from .protocol import CausalLM

if TYPE_CHECKING:
    from ..gpu.device import Device

__all__ = ["PAGE_SIZE", "PREFILL_CHUNK", "check_chunk", "context_of", "new_cache"]

PAGE_SIZE = 16
"""Tokens per page of a cache unless told (the engine's presets too)."""
PREFILL_CHUNK = 128
"""Prompt tokens per forward unless told (the engine's ``desktop`` preset too)."""


def context_of(model: CausalLM, cache: "PagedKVCache", limit: int | None = None) -> int:
    """The most tokens of prompt and reply a generation holds: the least of the model's context, the cache's
    and ``limit`` (None: no other limit)."""
    return min(model.max_context, cache.limits.max_total_seq_len, limit or model.max_context)


def check_chunk(prefill_chunk: int, cache: "PagedKVCache") -> int:
    limit = cache.limits.prefill_chunk_size
    if isinstance(prefill_chunk, bool) or not isinstance(prefill_chunk, int) or not 1 <= prefill_chunk <= limit:
        raise FieldError("prefill_chunk", f"an integer in [1, {limit}] (the cache's prefill_chunk_size)",
                         prefill_chunk)
    return prefill_chunk


def new_cache(model: CausalLM, device: "Device", *, max_tokens: int | None = None, prefill_chunk: int = PREFILL_CHUNK,
              page_size: int = PAGE_SIZE, num_seqs: int = 1) -> "PagedKVCache":
    """A cache of ``model``'s layout for ``num_seqs`` sequences of up to ``max_tokens`` (default: the model's
    context) tokens each, taking up to ``prefill_chunk`` tokens per forward."""
    check_instance("model", model, CausalLM, "a CausalLM (a loaded model)")
    for name, value in (("prefill_chunk", prefill_chunk), ("page_size", page_size), ("num_seqs", num_seqs)):
        check_int(name, value, 1)
    tokens = model.max_context if max_tokens is None else check_int("max_tokens", max_tokens, 1)
    return PagedKVCache(device, model.kv_layout(page_size), CacheLimits(num_seqs, num_seqs * tokens, prefill_chunk))
