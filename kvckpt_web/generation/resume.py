"""Resuming a generation from its checkpoint with the tokens an uninterrupted run gives.

:func:`resume` reads the newest checkpoint of a name (or a given generation), imports its K/V if they fit the
model and the cache, and returns a :class:`~kvckpt_web.generation.generator.Generator` that takes exactly the step
an uninterrupted run takes next. If the K/V cannot be used (another model, another layout, damaged or missing
chunks), it says why and runs the saved tokens through the model again, in the same forward calls as the
original run, so the K/V and the continuation are the same either way.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from ..checks import check_bool, check_int
from ..durable.catalog import load_manifest
from ..durable.container import Manifest
from ..durable.ledger import Ledger, ledger_for
from ..durable.restore import restore
from ..durable.results import Progress, SaveResult
from ..errors import (CorruptionError, FieldError, FormatError, MetadataError, SequenceError,
                      UnusableCheckpointError)
from ..model.caches import check_chunk, context_of
from ..model.protocol import CausalLM
from ..stores.base import check_store
from .app_state import SavedGeneration, StopRules, parse_app_state
from .autosave import Autosave
from .generator import Generator, check_callbacks, check_run_options
from .json_constraint import Vocabulary
from .results import ResumeReport, TokenEvent

if TYPE_CHECKING:
    from ..kv.cache import PagedKVCache
    from ..stores.base import Store

__all__ = ["resume"]


def _why_not(exc: Exception) -> str:
    if isinstance(exc, CorruptionError):
        return "corrupt"
    return "layout"


async def resume(store: "Store", name: str, model: CausalLM, cache: "PagedKVCache", *,
                 seq_id: int = 0, generation: int | None = None, autosave: Autosave | None = None,
                 max_tokens: int | None = None, context: int | None = None,
                 decode: Callable[[Sequence[int]], str] | None = None,
                 on_token: Callable[[TokenEvent], None] | None = None,
                 on_save: Callable[[SaveResult], None] | None = None,
                 on_save_error: Callable[[Exception], None] | None = None,
                 progress: Progress | None = None, replay: bool = True, ledger: Ledger | None = None,
                 vocabulary: Vocabulary | None = None) -> Generator:
    """The generation saved as ``name`` in ``store`` (its newest generation, or ``generation``), ready to
    continue in sequence ``seq_id`` of ``cache`` (a :class:`~kvckpt_web.generation.generator.Generator`).

    Imports the checkpoint's K/V if they fit ``model`` and ``cache``; otherwise (another model identity,
    another layout, a damaged or missing chunk, another length) runs the saved tokens through ``model``
    again. Either way the continuation is the one an uninterrupted run produces; the generator's
    ``resume_report`` says which happened and why. The run goes on with the checkpoint's settings: its
    prefill chunk, its context (also when ``cache`` holds more) and, where ``autosave`` leaves them None,
    its autosave interval and generations kept. ``max_tokens`` and ``context`` replace the saved limits
    (a generation that ended at a limit goes on under a higher one; one that ended otherwise stays
    finished). Raises NotFoundError if there is no checkpoint, and CorruptionError or FormatError if its
    manifest or ``app_state`` cannot be read: only then are its tokens lost. With ``replay=False`` K/V that
    cannot be used raise UnusableCheckpointError (naming the reason) instead, and the cache is left as it was.

    With ``autosave``, the generator holds that name's claim until :meth:`Generator.close`: ConflictError at
    once, nothing changed, while another writer holds it, or if ``autosave`` saves under another name or
    store than ``name`` in ``store`` and that name holds another conversation.

    ``ledger`` remembers what the restore loaded, so that the next save writes only what changed since
    (default: the autosave's if it saves to ``store``, else the store object's own). A reply held to a
    ``response_format`` goes on held to it, over the tokens of ``vocabulary`` (FieldError without one).
    """
    check_store(store)
    check_run_options(model, cache, seq_id, autosave)
    if ledger is None and autosave is not None and autosave.store is store:
        ledger = autosave.ledger
    ledger = ledger_for(store, ledger)
    if max_tokens is not None:
        check_int("max_tokens", max_tokens, 1)
    check_callbacks(decode=decode, on_token=on_token, on_save=on_save, progress=progress)
    check_bool("replay", replay)
    if seq_id in cache.sequence_ids():
        raise SequenceError(f"seq_id: expected a sequence id not in the cache, got {seq_id}")
    manifest, _ = await load_manifest(store, name, generation)
    saved = parse_app_state(manifest.app_state)
    if max_tokens is not None:
        saved.stop = StopRules(max_tokens, saved.stop.eos_ids, saved.stop.stop_strings)
    if context is not None:
        saved.context = check_int("context", context, 1)
    check_chunk(saved.prefill_chunk, cache)
    room = context_of(model, cache)
    if saved.kv_length > room:
        raise FieldError("app_state.kv_length", f"at most {room} tokens (the context of the model and cache)",
                         saved.kv_length)
    if (max_tokens, context) != (None, None) and saved.finish_reason in (None, "length", "context"):
        # the limits alone decide whether it goes on
        saved.finish_reason = ("length" if len(saved.generated) >= saved.stop.max_tokens
                               else "context" if saved.kv_length >= context_of(model, cache, saved.context) else None)
    gen = Generator(model, cache, seq_id, saved, autosave=autosave, decode=decode, on_token=on_token,
                    on_save=on_save, on_save_error=on_save_error, progress=progress, vocabulary=vocabulary)
    # continuing the name it was saved as needs no check: the checkpoint read is that name's conversation
    await gen._hold_name(check=autosave is not None and (autosave.store is not store or autosave.name != name))
    try:
        gen.resume_report = await _bring_back(gen, store, manifest, saved, replay, ledger)
    except BaseException:
        await gen.close()
        raise
    return gen


async def _bring_back(gen: Generator, store: "Store", manifest: Manifest, saved: SavedGeneration, replay: bool,
                      ledger: Ledger) -> ResumeReport:
    """Put the K/V of ``manifest`` (the checkpoint ``gen`` was made from) into ``gen``'s sequence: imported if
    they can be used, else (``replay``) its tokens run again; what happened."""
    model, cache, seq_id, name = gen.model, gen.cache, gen.seq_id, manifest.name
    reason, message, restore_s = None, "", 0.0
    if saved.model != model.identity:
        reason, message = "model", (f"app_state.model: expected {model.identity!r} (this model), got "
                                    f"{saved.model!r}: the K/V are another model's")
    else:
        start = time.perf_counter()
        try:
            restored = await restore(store, name, cache, seq_id=seq_id, generation=manifest.generation, ledger=ledger)
        except (MetadataError, FormatError, CorruptionError) as exc:
            reason, message = _why_not(exc), str(exc)
        else:
            if restored.seq_length != saved.kv_length:
                cache.remove_sequence(seq_id)
                reason, message = "length", (f"{manifest.key}: seq_length expected {saved.kv_length} "
                                             f"(app_state.kv_length), got {restored.seq_length}")
        restore_s = time.perf_counter() - start
    replay_s = 0.0
    if reason is not None and not replay:
        raise UnusableCheckpointError(reason, message)
    if reason is not None:
        start = time.perf_counter()
        cache.add_sequence(seq_id)
        try:
            await gen._replay()
        except BaseException:
            cache.remove_sequence(seq_id)
            raise
        replay_s = time.perf_counter() - start
    return ResumeReport(name, manifest.generation, reason is None, reason,
                        message or "restored the checkpoint's K/V", gen.kv_length, restore_s, replay_s)
