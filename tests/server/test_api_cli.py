"""``kvckpt serve --api``: flags checked before the model loads and before listening, the base URL printed, and a
server killed with SIGKILL mid-reply that restarts on its store: the history comes from the persistent prefix and
the cut reply resumes to the tokens an uninterrupted server gives (with the tiny llama, and with Gemma 3 270M, a
base model, through plain completions); SmolLM2 chatting and Gemma completing over the API."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from api_helpers import SEEDED, USER, api_serving, client, raw, serving_api
from serve_helpers import PATIENCE
from support.kvmodel import run

from kvckpt_web import FileStore
from kvckpt_web.cli.main import main
from kvckpt_web.model import loader
from kvckpt_web.server.worker import DEFAULT_QUEUE


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("kvckpt: error: "), err
    return err


@pytest.mark.parametrize("flag, value", [("--model-name", "m"), ("--context", "64"), ("--max-tokens", "8"),
                                         ("--lease", "5"), ("--unnamed-ttl", "60"), ("--unnamed-max-bytes", "1000"),
                                         ("--unnamed-check-every", "5"), ("--queue", "2")])
def test_an_api_flag_without_api_is_a_one_line_error(pyodide, capsys, flag, value):
    status = main(["serve", "--port", "0", "--pyodide", str(pyodide), flag, value])
    assert status == 1 and f"{flag}: expected --api" in one_line_error(capsys)


def test_a_store_served_without_api_needs_its_token(pyodide, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("KVCKPT_STORE_TOKEN", raising=False)
    status = main(["serve", "--port", "0", "--pyodide", str(pyodide), "--store", str(tmp_path / "s")])
    assert status == 1 and "--token" in one_line_error(capsys)


@pytest.mark.parametrize("flags", [["--page", "."], ["--open"], ["--wheels", "."], ["--token", "x" * 16]])
def test_a_browser_runtime_flag_with_api_is_a_one_line_error(capsys, flags):
    status = main(["serve", "--api", "--port", "0", *flags])
    assert status == 1 and f"{flags[0]}: expected no browser runtime flag with --api" in one_line_error(capsys)


class NotServing:
    """A server on ``host`` port 8123 that stops at once, as Ctrl-C stops one."""

    def __init__(self, host: str) -> None:
        self.server_address, self.url = (host, 8123), f"http://{host}:8123/"

    def serve_forever(self) -> None:
        raise KeyboardInterrupt

    def server_close(self) -> None:
        pass


@pytest.fixture
def no_model_load(monkeypatch):
    """Loading a model fails the test: what is checked must be checked before."""
    monkeypatch.setattr(loader, "load_model", lambda *args: pytest.fail("the model was loaded"))


@pytest.mark.parametrize("flags, error", [
    (["--context", "1"], "--context: expected an integer >= 2"),
    (["--max-tokens", "0"], "--max-tokens: expected an integer >= 1"),
    (["--unnamed-ttl", "-1"], "--unnamed-ttl: expected a finite number of seconds >= 0"),
    (["--unnamed-max-bytes", "-1"], "--unnamed-max-bytes: expected an integer >= 0"),
    (["--unnamed-check-every", "-1"], "--unnamed-check-every: expected a finite number of seconds >= 0"),
    (["--queue", "-1"], "--queue: expected an integer >= 0"),
    (["--model-name", "my model"], "--model-name: expected 1 to 256 printable characters without spaces"),
    (["--model", "missing.gguf"], "--model: expected a GGUF model file"),
    (["--host", "0.0.0.0"], "--host: expected a loopback address"),
    (["--lease", "0", "--store", "s3://bucket/chats"], "--lease: expected a lease of more than 0 and at most 3600"),
    (["--lease", "5"], "--lease: expected an object storage --store URL beside it"),
], ids=["context", "max tokens", "unnamed ttl", "unnamed max bytes", "unnamed check every", "queue", "model name", "model", "host", "lease",
        "lease without an object store"])
def test_bad_flags_are_one_line_errors_before_the_model_loads(tiny_llama_path, capsys, no_model_load, flags, error):
    model = [] if "--model" in flags else ["--model", str(tiny_llama_path)]  # --api runs one --model
    status = main(["serve", "--api", "--port", "0", *model, *flags])
    assert status == 1 and error in one_line_error(capsys)


def test_a_store_directory_of_other_files_is_refused_before_the_model_loads(tiny_llama_path, tmp_path, capsys,
                                                                            no_model_load):
    (tmp_path / "notes.txt").write_text("mine")
    status = main(["serve", "--api", "--port", "0", "--model", str(tiny_llama_path), "--store", str(tmp_path)])
    assert status == 1 and "expected a store directory" in one_line_error(capsys)
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]


def test_allow_remote_serves_the_api_beyond_loopback_with_a_loud_warning(monkeypatch, tiny_llama_path, capsys):
    from kvckpt_web.server import api, worker

    class NoEngine:
        def __init__(self, build, **settings) -> None:
            pass

        def close(self) -> None:
            pass

    monkeypatch.setattr(worker, "EngineWorker", NoEngine)
    monkeypatch.setattr(api, "make_api_server", lambda engine, **kwargs: NotServing("0.0.0.0"))
    status = main(["serve", "--api", "--model", str(tiny_llama_path), "--host", "0.0.0.0", "--allow-remote"])
    out, err = capsys.readouterr()
    assert status == 0 and "http://0.0.0.0:8123/v1" in out
    assert err.splitlines()[-1].startswith("kvckpt serve: WARNING: listening on 0.0.0.0 port 8123, beyond this "
                                           "machine: anyone who can reach it over the network can run the model")


def test_a_server_killed_mid_reply_restarts_on_its_store_from_the_persistent_prefix_and_resumes_the_reply(
        tiny_llama_path, make_worker, tmp_path):
    second_turn = {"role": "user", "content": "and the wind?"}
    settings = {**SEEDED, "seed": 4, "max_tokens": 48}  # replies without a NUL (refused in a message)

    def chat(url, messages, **kwargs):
        return client(url).chat.completions.create(model="tiny", messages=messages, **settings, **kwargs)

    with api_serving(make_worker(store=FileStore(tmp_path / "uninterrupted"))) as url:  # the CLI's settings
        first = chat(url, [USER])
        messages = [USER, {"role": "assistant", "content": first.choices[0].message.content}, second_turn]
        want = chat(url, messages)
    assert len(want.kvckpt["token_ids"]) > 8  # the reply outlasts the kill point
    store = str(tmp_path / "store")
    with serving_api("--model", str(tiny_llama_path), "--model-name", "tiny", "--store", store) as (url, server):
        assert chat(url, [USER]).kvckpt["token_ids"] == first.kvckpt["token_ids"]
        stream = chat(url, messages, stream=True)
        chunks = iter(stream)
        name = [next(chunks) for _ in range(5)][0].kvckpt["conversation"]
        server.kill()  # SIGKILL, mid-reply: no save or clean-up runs
        server.wait(PATIENCE)
        stream.response.close()
    with serving_api("--model", str(tiny_llama_path), "--model-name", "tiny", "--store", store) as (url, server):
        cut = client(url).get("/kvckpt/conversations", cast_to=object)["data"]
        assert [(c["name"], c["finished"]) for c in cut] == [(name, False)]
        again = chat(url, messages)  # the client asks again: the whole history comes from the store
        assert again.usage.prompt_tokens_details.cached_tokens == again.usage.prompt_tokens - 1
        assert again.usage.timings["restore_s"] > 0 and again.kvckpt["conversation"] != name
        status, _, body = raw(url, "POST", f"/v1/kvckpt/conversations/{name}/resume")
        resumed = json.loads(body)
    assert status == 200 and resumed["kvckpt"]["token_ids"] == want.kvckpt["token_ids"]
    assert resumed["choices"][0]["message"]["content"] == want.choices[0].message.content


@pytest.mark.real_model
def test_smollm2_chats_over_the_api_streaming_two_turns_whose_second_reuses_the_first(smollm_path, tmp_path):
    store = str(tmp_path / "store")
    with serving_api("--store", store) as (url, _):
        api = client(url)
        model = api.models.list().data[0].id
        messages = [{"role": "user", "content": "What is the capital of France?"}]
        turns = []
        for question in ("And of Italy?", None):
            chunks = list(api.chat.completions.create(model=model, messages=messages, max_tokens=12, temperature=0,
                                                      stream=True, stream_options={"include_usage": True}))
            turns.append(chunks[-1].usage)
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            if question is not None:
                assert "Paris" in text
                messages += [{"role": "assistant", "content": text}, {"role": "user", "content": question}]
    assert model == Path(smollm_path).name.removesuffix(".gguf")
    assert turns[1].prompt_tokens_details.cached_tokens == turns[0].prompt_tokens + turns[0].completion_tokens - 1


def test_a_context_over_the_models_is_refused_naming_it_not_clamped(monkeypatch, tiny_llama_path, capsys):
    from lm_double import DoubleLM, DoubleText

    from kvckpt_web.gpu import open as gpu_open
    from kvckpt_web.model.protocol import LoadedModel

    monkeypatch.setattr(gpu_open, "open_device", lambda: None)
    monkeypatch.setattr(loader, "load_model", lambda path, device: LoadedModel(DoubleLM(), DoubleText()))
    status = main(["serve", "--api", "--port", "0", "--model", str(tiny_llama_path), "--context", "99999999"])
    assert status == 1 and capsys.readouterr().err.splitlines()[-1] == (
        "kvckpt: error: --context: expected at most 96 tokens (the model's context), got 99999999")


@pytest.mark.parametrize("flags, fields, queue", [([], {}, DEFAULT_QUEUE),
                                                  (["--context", "64"], {"context": 64}, DEFAULT_QUEUE),
                                                  (["--max-tokens", "8"], {"max_tokens": 8}, DEFAULT_QUEUE),
                                                  (["--queue", "0"], {}, 0)],
                         ids=["preset", "context flag", "max tokens flag", "queue flag"])
def test_the_api_runs_the_desktop_preset_with_its_flags_fields_fitted_to_the_model(monkeypatch, tiny_llama_path,
                                                                                    device, capsys, flags, fields,
                                                                                    queue):
    from lm_double import DoubleLM, DoubleText

    from kvckpt_web.engine import PRESETS
    from kvckpt_web.gpu import open as gpu_open
    from kvckpt_web.model.protocol import LoadedModel
    from kvckpt_web.server import api, worker

    built, queues = [], []

    class Built:  # the engine built at once, on this thread
        def __init__(self, build, queue) -> None:
            built.append(build())
            queues.append(queue)

        def close(self) -> None:
            run(built[0].close())

    monkeypatch.setattr(gpu_open, "open_device", lambda: device)
    monkeypatch.setattr(loader, "load_model", lambda path, device: LoadedModel(DoubleLM(), DoubleText()))
    monkeypatch.setattr(worker, "EngineWorker", Built)
    monkeypatch.setattr(api, "make_api_server", lambda engine, **kwargs: NotServing("127.0.0.1"))
    assert main(["serve", "--api", "--model", str(tiny_llama_path), *flags]) == 0
    assert built[0].config == PRESETS["desktop"].replace(**fields).fitted(96)
    assert queues == [queue]


@pytest.mark.real_model
def test_gemma3_completes_over_the_api_streaming_the_greedy_continuation_generate_gives(gemma_path, tmp_path, capsys):
    prompt = "Paris is the capital of"
    assert main(["generate", "--model", str(gemma_path), "--raw", "--prompt", prompt, "--temperature", "0",
                 "--max-tokens", "12", "--store", str(tmp_path / "generated")]) == 0
    want = capsys.readouterr().out.removesuffix("\n")
    with serving_api("--model", str(gemma_path), "--store", str(tmp_path / "store")) as (url, _):
        api = client(url)
        model = api.models.list().data[0].id
        chunks = list(api.completions.create(model=model, prompt=prompt, max_tokens=12, temperature=0, stream=True))
    assert model == gemma_path.name.removesuffix(".gguf")
    assert "".join(c.choices[0].text for c in chunks if c.choices) == want


@pytest.mark.real_model
def test_a_gemma3_server_killed_mid_completion_restarts_on_its_store_and_resumes_it_to_the_uninterrupted_tokens(
        gemma_path, tmp_path):
    settings = {"prompt": "Paris is the capital of", "max_tokens": 12, "temperature": 0.9, "top_p": 0.9, "seed": 7}

    def serving(store):
        return serving_api("--model", str(gemma_path), "--model-name", "gemma", "--store", str(tmp_path / store))

    with serving("uninterrupted") as (url, _):
        want = client(url).completions.create(model="gemma", **settings)
    with serving("store") as (url, server):
        stream = client(url).completions.create(model="gemma", stream=True, **settings)
        chunks = iter(stream)
        name = [next(chunks) for _ in range(5)][0].kvckpt["conversation"]
        server.kill()  # SIGKILL, mid-completion: no save or clean-up runs
        server.wait(PATIENCE)
        stream.response.close()
    with serving("store") as (url, _):
        status, _, body = raw(url, "POST", f"/v1/kvckpt/conversations/{name}/resume")
    resumed = json.loads(body)
    assert status == 200 and resumed["object"] == "text_completion"
    assert resumed["kvckpt"]["token_ids"] == want.kvckpt["token_ids"] and len(want.kvckpt["token_ids"]) == 12
    assert resumed["choices"][0]["text"] == want.choices[0].text


def test_a_server_killed_with_four_replies_running_leaves_each_resumable_to_its_uninterrupted_tokens(
        tiny_llama_path, make_worker, tmp_path):
    asks = [[{"role": "user", "content": f"tell me story number {i} about the sea."}] for i in range(4)]
    settings = [{**SEEDED, "seed": 10 + i, "max_tokens": 160} for i in range(4)]

    def chat(url, i, **kwargs):
        return client(url).chat.completions.create(model="tiny", messages=asks[i], **settings[i], **kwargs)

    with api_serving(make_worker(store=FileStore(tmp_path / "uninterrupted"))) as url:  # the CLI's settings
        want = [chat(url, i).kvckpt["token_ids"] for i in range(4)]
    assert all(len(ids) > 8 for ids in want)  # each reply outlasts the kill point
    store = str(tmp_path / "store")
    with serving_api("--model", str(tiny_llama_path), "--model-name", "tiny", "--store", store) as (url, server):
        streams = [chat(url, i, stream=True) for i in range(4)]  # all four running at once
        names = [[next(iter(stream)) for _ in range(3)][0].kvckpt["conversation"] for stream in streams]
        server.kill()  # SIGKILL, four replies mid-way: no save or clean-up runs
        server.wait(PATIENCE)
        for stream in streams:
            stream.response.close()
    with serving_api("--model", str(tiny_llama_path), "--model-name", "tiny", "--store", store) as (url, server):
        cut = {c["name"]: c["finished"] for c in client(url).get("/kvckpt/conversations", cast_to=object)["data"]}
        assert cut == {name: False for name in names}
        resumed = [json.loads(raw(url, "POST", f"/v1/kvckpt/conversations/{name}/resume")[2]) for name in names]
    assert [r["kvckpt"]["token_ids"] for r in resumed] == want
