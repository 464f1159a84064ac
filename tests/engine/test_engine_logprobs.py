"""Log probabilities of a reply's tokens (OpenAI's ``logprobs``): a chat's ``choices[].logprobs.content[]``, a plain
completion's legacy ``tokens`` / ``token_logprobs`` / ``top_logprobs`` / ``text_offset``, whole and streamed, on the
K/V-honest double (``tests/model/lm_double.py``), whose logits' log-softmax is computed in float64."""

from __future__ import annotations

import math

from kvckpt_web import MemoryStore

from lm_double import DoubleText
from support.kvmodel import run

MESSAGES = [{"role": "user", "content": "hello"}]
GREEDY = {"temperature": 0.0, "max_tokens": 8}


def chunks(stream):
    async def read():
        return [c async for c in await stream]
    return run(read())


def test_a_chat_reply_carries_each_tokens_logprob_and_its_top_alternatives(make_engine):
    reply = run(make_engine().chat(MESSAGES, **GREEDY, logprobs=3)).to_openai()
    content = reply["choices"][0]["logprobs"]["content"]
    assert len(content) == reply["usage"]["completion_tokens"]
    for entry, token in zip(content, reply["kvckpt"]["token_ids"]):
        assert entry["token"] == DoubleText().decode([token]) and entry["bytes"] == list(entry["token"].encode())
        assert len(entry["top_logprobs"]) == 3 and entry["logprob"] <= 0
        assert entry["top_logprobs"][0] == {"token": entry["token"], "logprob": entry["logprob"],
                                            "bytes": entry["bytes"]}  # greedy: the most likely token
        assert sum(math.exp(t["logprob"]) for t in entry["top_logprobs"]) <= 1 + 1e-9


def test_a_chat_reply_without_logprobs_has_them_null(make_engine):
    assert run(make_engine().chat(MESSAGES, **GREEDY)).to_openai()["choices"][0]["logprobs"] is None


def test_streamed_chunks_carry_their_tokens_logprobs(make_engine):
    whole = run(make_engine().chat(MESSAGES, **GREEDY, logprobs=2)).to_openai()["choices"][0]["logprobs"]
    wire = [c.to_openai()["choices"][0]["logprobs"] for c in chunks(make_engine().chat(MESSAGES, stream=True,
                                                                                      **GREEDY, logprobs=2))]
    assert [e for w in wire if w is not None for e in w["content"]] == whole["content"]
    assert all(w is None or len(w["content"]) == 1 for w in wire)


def test_a_completion_carries_the_legacy_logprobs_shape(make_engine):
    reply = run(make_engine().complete("once upon a time", **GREEDY, logprobs=2))
    logprobs = reply.to_openai()["choices"][0]["logprobs"]
    assert logprobs["tokens"] == [DoubleText().decode([t]) for t in reply.token_ids]
    assert len(logprobs["token_logprobs"]) == len(reply.token_ids)
    assert all(len(top) <= 2 and logprobs["tokens"][i] in top for i, top in enumerate(logprobs["top_logprobs"]))
    assert logprobs["text_offset"] == [len("".join(logprobs["tokens"][:i])) for i in range(len(reply.token_ids))]
    streamed = [c.to_openai()["choices"][0]["logprobs"]
                for c in chunks(make_engine().complete("once upon a time", stream=True, **GREEDY, logprobs=2))]
    assert [t for s in streamed if s is not None for t in s["token_logprobs"]] == logprobs["token_logprobs"]


def test_a_resumed_reply_goes_on_giving_logprobs(make_engine):
    store = MemoryStore()
    engine = make_engine(store=store)

    async def cut_and_resume():
        stream = await engine.chat(MESSAGES, stream=True, **{**GREEDY, "max_tokens": 12}, logprobs=1)
        got = 0
        async for chunk in stream:
            got += len(chunk.token_ids)
            if got == 4:
                break
        await stream.aclose()
        name = (await engine.unfinished())[0].name
        await engine.close()  # a restarted process: the reply comes back from the store
        return await make_engine(store=store).resume(name)

    reply = run(cut_and_resume())
    assert len(reply.to_openai()["choices"][0]["logprobs"]["content"]) == len(reply.token_ids) - 4
