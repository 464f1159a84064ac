"""How often a request asks the store (a :class:`CountingStore` counts): before the first token of a stored
conversation's next turn in a restarted process (its K/V come from the store), until the turn's first save (which
commits its messages before the prefill; its commit and retention are not the request's questions), the
conversation's manifests are listed and its newest manifest read once for the request's view of it, and once
more by the save, under its lock, whose check that the name's newest generation is still its conversation's is
the only ownership check (the ledger knows that generation's conversation: it reads the manifest only to see
that it is unchanged); no listing of every chunk or every manifest is made. The prefix index is listed again
only at a miss."""

from __future__ import annotations

from collections import Counter

import pytest

from support.counting_store import CountingStore, count
from kvckpt_web.durable.catalog import manifest_keys

from support.kvmodel import run

GREEDY = {"temperature": 0.0, "max_tokens": 6}
FIRST = [{"role": "user", "content": "hello there, who are you? tell me about the sea and the wind."}]


async def _next_turn(make_engine, named: bool) -> tuple[str, int, Counter]:
    """A stored conversation's name, newest generation, and the store calls a restarted engine makes for its next
    turn before it writes anything (its first save, before the prefill and the first token)."""
    store = CountingStore()
    naming = {"conversation": "c"} if named else {}
    reply = await make_engine(store=store).chat(FIRST, **GREEDY, **naming)
    newest = (await manifest_keys(store, reply.conversation))[-1][1]
    engine = make_engine(store=store)
    await engine.sources.refresh()  # a process that started: it read the prefix index once
    store.reset()
    stream = await engine.chat(FIRST + [{"role": "assistant", "content": reply.text},
                                        {"role": "user", "content": "and the sky?"}],
                               stream=True, **GREEDY, **naming)
    assert store.before_write is not None  # the turn's messages were committed before its first token
    calls = store.before_write
    chunks = [chunk async for chunk in stream]
    assert chunks[0].conversation == reply.conversation and chunks[-1].usage.cached_tokens > 0  # from the store
    return reply.conversation, newest, calls


@pytest.mark.parametrize("named", [True, False], ids=["named", "unnamed"])
def test_a_stored_conversations_next_turn_lists_its_manifests_for_its_view_and_its_save_only(make_engine, named):
    name, newest, calls = run(_next_turn(make_engine, named))
    assert count(calls, "list", f"manifests/{name}/") == 2  # the view; the save's, under its lock
    assert calls["get", f"manifests/{name}/{newest:020d}"] == 2  # the view's; the save's check that it is unchanged
    assert count(calls, "list", "chunks/") == 0 and count(calls, "list", "manifests/") == 2


@pytest.mark.parametrize("named", [True, False], ids=["named", "unnamed"])
def test_a_stored_conversations_next_turn_found_in_the_prefix_index_does_not_list_it_again(make_engine, named):
    _, _, calls = run(_next_turn(make_engine, named))
    assert count(calls, "list", "prefixes/") == 0


def test_a_prompt_the_prefix_index_misses_lists_it_once_to_find_what_other_writers_committed(make_engine):
    store = CountingStore()
    engine = make_engine(store=store)
    run(engine.sources.refresh())  # started before the other writer's reply
    reply = run(make_engine(store=store).chat(FIRST, **GREEDY))
    store.reset()
    again = run(engine.chat(FIRST + [{"role": "assistant", "content": reply.text},
                                     {"role": "user", "content": "and the sky?"}], **GREEDY))
    assert again.conversation == reply.conversation and again.usage.cached_tokens > 0
    assert count(store.calls, "list", f"prefixes/{engine.sources.index.scope_id}/") == 1  # retention lists all
