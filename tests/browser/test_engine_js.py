"""The chat engine's JavaScript API (kvckpt.mjs: createEngine) in headless Chromium with the tiny random llama:
OpenAI-shaped chunks with usage, Errors naming the field, replies that survive the worker's end, and the model's
weights kept in the browser (a new engine reads them from the Cache API; a changed file is fetched anew)."""

from __future__ import annotations

import json

import pytest

from kvckpt_web.bench.holding import HOLD_REPLIES

from .browser_harness import BOOT_TIMEOUT_MS, CDPChromium

BLANK = "<!doctype html><meta charset='utf-8'><title>engine</title>"
GREEDY = "{temperature: 0, max_tokens: 16}"

# JS helpers every test page has: start(options) an engine (window.engine), ask(body) the chunks of a streamed reply.
HELPERS = """
window.start = async (options = {}) => {
  const { createEngine } = await import("/kvckpt.mjs");
  window.stages = [];
  window.engine = await createEngine({ model: "/model.gguf", storeName: "js", onProgress: (p) => {
    if (window.stages[window.stages.length - 1] !== p.stage) window.stages.push(p.stage); }, ...options });
  return window.engine.info;
};
window.chunksOf = async (stream, stopAfter = Infinity) => {
  const chunks = [];
  for await (const chunk of stream) {
    chunks.push(chunk);
    if (chunks.length === stopAfter) break;
  }
  return chunks;
};
window.ask = async (content, settings = {}) => window.chunksOf(await window.engine.chat.completions.create(
  { messages: [{ role: "user", content }], stream: true, temperature: 0, max_tokens: 16, ...settings }));
window.ids = (chunks) => chunks.flatMap((c) => c.kvckpt.token_ids);
window.caught = async (promise) => {
  try { await promise; return null; } catch (e) { return { isError: e instanceof Error, name: e.name,
    message: e.message, field: e.field ?? null, expected: e.expected ?? null, got: e.got ?? null }; }
};
"""


class JsPage:
    """A blank page of the chat server's origin in a Chromium of its own (its profile: storage, Cache API)."""

    def __init__(self, chromium: CDPChromium, url: str) -> None:
        self.chromium = chromium
        self.url = url
        self.requests: list[tuple[str, str]] = []
        chromium.context.on("request", lambda r: self.requests.append((r.method, r.url.split("/")[-1])))
        self.page = chromium.context.new_page()
        self.page.add_init_script(HOLD_REPLIES)
        self.page.route(url + "blank.html", lambda route: route.fulfill(content_type="text/html", body=BLANK))
        self.load()

    def load(self) -> None:
        self.page.goto(self.url + "blank.html")
        self.page.evaluate(HELPERS)

    def run(self, script: str, arg=None):
        return self.page.evaluate(f"async (arg) => {{ {script} }}", arg)

    def model_gets(self) -> int:
        return sum(1 for method, name in self.requests if method == "GET" and name == "model.gguf")


@pytest.fixture
def js_page(browser_prereqs, playwright_instance, chat_server, tmp_path):
    chromium = CDPChromium(browser_prereqs["chromium"], tmp_path / "profile", playwright_instance)
    chromium.context.set_default_timeout(BOOT_TIMEOUT_MS)
    yield JsPage(chromium, chat_server.url)
    chromium.close()


def test_a_streamed_reply_is_openai_chunks_whose_last_has_usage_with_cached_tokens_and_timings(js_page):
    got = js_page.run("""
        await start();
        const first = await ask("tell me about the sea.");
        const text = first.map((c) => c.choices[0].delta.content ?? "").join("");
        const next = await chunksOf(await engine.chat.completions.create({ stream: true, temperature: 0, max_tokens: 8,
          messages: [{ role: "user", content: "tell me about the sea." }, { role: "assistant", content: text },
                     { role: "user", content: "and the wind?" }] }));
        return { first, next, stages };
    """)
    first, last = got["first"], got["first"][-1]
    assert all(c["object"] == "chat.completion.chunk" for c in first)
    assert first[0]["choices"][0]["delta"]["role"] == "assistant"
    assert last["choices"][0]["finish_reason"] == "length" and last["usage"]["completion_tokens"] == 16
    assert {"prefill_tokens_per_s", "decode_tokens_per_s"} <= set(last["usage"]["timings"])
    history = last["usage"]["prompt_tokens"] + 16 - 1
    assert got["next"][-1]["usage"]["prompt_tokens_details"]["cached_tokens"] == history
    assert got["next"][-1]["kvckpt"]["conversation"] == last["kvckpt"]["conversation"]
    assert got["stages"] == ["python", "packages", "weights", "upload", "engine", "kernels"]


def test_a_reply_without_stream_is_a_chat_completion(js_page):
    got = js_page.run("""
        await start();
        return await engine.chat.completions.create({ messages: [{ role: "user", content: "hi" }], temperature: 0,
                                                      max_tokens: 4 });
    """)
    assert got["object"] == "chat.completion" and got["choices"][0]["message"]["role"] == "assistant"
    assert got["usage"]["completion_tokens"] == 4 and len(got["kvckpt"]["token_ids"]) == 4


def test_a_plain_completion_streams_text_completion_chunks_mirroring_the_chat_call(js_page):
    got = js_page.run("""
        const info = await start();
        const body = { prompt: "the sea is", temperature: 0, max_tokens: 8 };
        const chunks = await chunksOf(await engine.completions.create({ ...body, stream: true }));
        return { info, chunks, whole: await engine.completions.create(body),
                 refused: await caught(engine.completions.create({ prompt: 7 })) };
    """)
    chunks, whole = got["chunks"], got["whole"]
    assert got["info"]["model"]["chat_template"] == "ChatML"
    assert all(c["object"] == "text_completion" for c in chunks) and whole["object"] == "text_completion"
    assert "".join(c["choices"][0]["text"] for c in chunks) == whole["choices"][0]["text"]
    assert chunks[-1]["usage"]["completion_tokens"] == whole["usage"]["completion_tokens"] >= 1
    assert got["refused"]["name"] == "FieldError" and got["refused"]["field"] == "prompt"


def test_errors_are_errors_with_the_kvckpt_class_and_the_field_expected_and_got(js_page):
    got = js_page.run("""
        const { createEngine } = await import("/kvckpt.mjs");
        const noModel = await caught(createEngine({ store: "indexeddb" }));
        const badStore = await caught(createEngine({ model: "/model.gguf", store: "localStorage" }));
        await start();
        const badRole = await caught(engine.chat.completions.create({ messages: [{ role: "robot", content: "hi" }] }));
        const badStream = await caught(engine.chat.completions.create(
          { messages: [{ role: "user", content: "hi" }], stream: true, temperature: 3 }));
        const missing = await caught(engine.resume("chat-none"));
        const list = await engine.conversations();
        return { noModel, badStore, badRole, badStream, missing, list };
    """)
    assert got["noModel"] == {"isError": True, "name": "FieldError", "field": "model", "got": "undefined",
                              "expected": "the URL of a GGUF model file",
                              "message": "model: expected the URL of a GGUF model file, got undefined"}
    assert got["badStore"]["name"] == "FieldError" and got["badStore"]["field"] == "store"
    assert got["badRole"]["isError"] and got["badRole"]["name"] == "FieldError"
    assert (got["badRole"]["field"], got["badRole"]["got"]) == ("messages[0].role", "robot")
    assert (got["badStream"]["name"], got["badStream"]["field"]) == ("FieldError", "temperature")
    assert got["missing"]["name"] == "NotFoundError"
    assert got["list"] == []  # nothing was stored by the refused calls


def test_a_reply_cut_by_the_workers_end_is_resumed_by_a_new_engine_to_the_uninterrupted_tokens(js_page):
    got = js_page.run("""
        await start();
        const want = ids(await ask("tell me about the sea."));
        kvckptHold.hold(9);
        const stream = await engine.chat.completions.create({ stream: true, temperature: 0, max_tokens: 16,
          messages: [{ role: "user", content: "tell me about the sea!" }] });
        const seen = await chunksOf(stream, 9);
        engine.terminate();   // a crash: nothing saved on the way out
        const afterEnd = await caught(engine.conversations());
        const again = await start();
        const open = await engine.unfinished();
        const resumed = await engine.resume(open[0].name, { stream: true });
        const rest = await chunksOf(resumed);
        const wantCut = ids(await ask("tell me about the sea!", { max_tokens: 16 }));
        return { want, wantCut, seen: ids(seen), got: ids(rest), restored: resumed.restored, afterEnd,
                 open: open.map((o) => o.name), name: seen[0].kvckpt.conversation, weights: again.weights };
    """)
    assert got["afterEnd"]["name"] == "Terminated"
    assert got["open"] == [got["name"]]
    assert got["restored"]["kv_restored"] is True and got["restored"]["tokens"] > 0
    assert got["got"] == got["wantCut"] and got["got"][:9] == got["seen"]
    assert got["weights"]["source"] == "cache"


def test_leaving_a_stream_early_stops_the_reply_and_leaves_it_resumable(js_page):
    got = js_page.run("""
        await start();
        const stream = await engine.chat.completions.create({ stream: true, temperature: 0, max_tokens: 16,
          messages: [{ role: "user", content: "tell me about the sea." }] });
        const seen = await chunksOf(stream, 3);   // break: the stream's return() stops the reply
        const open = await engine.unfinished();
        const rest = await engine.resume(open[0].name);
        return { name: seen[0].kvckpt.conversation, open: open.map((o) => o.name), rest };
    """)
    assert got["open"] == [got["name"]]
    assert got["rest"]["choices"][0]["finish_reason"] == "length" and len(got["rest"]["kvckpt"]["token_ids"]) == 16


def test_interrupt_ends_the_reply_with_abort_and_it_is_listed_unfinished(js_page):
    got = js_page.run("""
        await start();
        const stream = await engine.chat.completions.create({ stream: true, temperature: 0, max_tokens: 16,
          messages: [{ role: "user", content: "tell me about the sea." }] });
        const chunks = [];
        for await (const chunk of stream) { chunks.push(chunk); if (chunks.length === 2) await engine.interrupt(); }
        return { last: chunks[chunks.length - 1], open: (await engine.unfinished()).map((o) => o.finished) };
    """)
    assert got["last"]["choices"][0]["finish_reason"] == "abort" and got["open"] == [False]


def test_two_streams_run_together_and_interrupt_by_name_stops_one_alone(js_page):
    got = js_page.run("""
        await start();
        const ask = (content) => engine.chat.completions.create({ stream: true, temperature: 0, max_tokens: 16,
          messages: [{ role: "user", content }] });
        const streams = [await ask("tell me about the sea."), await ask("what is a boat?")];
        const readers = streams.map((s) => s[Symbol.asyncIterator]());
        const first = (await readers[0].next()).value;
        await engine.interrupt(first.kvckpt.conversation);
        const last = [];
        for (const reader of readers) {
          let end = null;
          for (let r = await reader.next(); !r.done; r = await reader.next()) end = r.value;
          last.push(end.choices[0].finish_reason);
        }
        return { last, open: (await engine.unfinished()).map((o) => o.name), name: first.kvckpt.conversation };
    """)
    assert got["last"][0] == "abort" and got["last"][1] != "abort" and got["open"] == [got["name"]]


def test_a_new_engine_reads_the_weights_from_the_browser_and_not_from_the_server(js_page):
    first = js_page.run("return (await start()).weights;")
    gets = js_page.model_gets()
    js_page.load()  # a reload
    again = js_page.run("return (await start()).weights;")
    assert first == {"source": "network", "kept": True, "note": ""}
    assert again == {"source": "cache", "kept": True, "note": ""}
    assert gets == 1 and js_page.model_gets() == 1
    assert ("HEAD", "model.gguf") in js_page.requests


def test_a_changed_model_file_at_the_same_url_is_fetched_anew(js_page, chat_server):
    first = js_page.run("return (await start()).model;")
    chat_server.use_tiny(seed=1)  # other weights at the same URL, the same size
    js_page.load()
    again = js_page.run("const info = await start(); return { ...info.model, source: info.weights.source };")
    assert again["source"] == "network" and js_page.model_gets() == 2
    assert again["identity"] != first["identity"] and again["bytes"] == first["bytes"]


def test_a_missing_model_file_rejects_naming_its_url(js_page, chat_server):
    chat_server.remove_model()
    got = js_page.run("return await caught(start());")
    assert got["name"] == "ModelUnavailableError" and got["field"] == "model"
    assert got["expected"].endswith("/model.gguf") and got["got"] == "HTTP 404"


def test_a_json_object_response_format_gives_a_reply_that_parses_streamed_and_whole(js_page):
    got = js_page.run("""
        await start();
        const body = { messages: [{ role: "user", content: "tell me about the sea." }], temperature: 0,
                       max_tokens: 64, response_format: { type: "json_object" } };
        const chunks = await chunksOf(await engine.chat.completions.create({ ...body, stream: true }));
        const whole = await engine.chat.completions.create(body);
        const refused = await caught(engine.chat.completions.create({ ...body, response_format: { type: "json_schema",
          json_schema: { name: "a", schema: { type: "string", pattern: "^a" } } } }));
        return { streamed: chunks.map((c) => c.choices[0].delta.content ?? "").join(""),
                 finish: chunks[chunks.length - 1].choices[0].finish_reason, whole, refused };
    """)
    assert got["finish"] == "stop" and got["whole"]["choices"][0]["finish_reason"] == "stop"
    assert isinstance(json.loads(got["streamed"]), dict)
    assert isinstance(json.loads(got["whole"]["choices"][0]["message"]["content"]), dict)
    assert got["refused"]["name"] == "FieldError"
    assert got["refused"]["field"] == "response_format.json_schema.schema.pattern"
