"""``kvckpt generate --raw``: the plain completion of a raw prompt (what a base model answers), and a base model
refused without it in one line."""

from __future__ import annotations

import pytest

from kvckpt_web.cli.main import main
from kvckpt_web.engine import PRESETS, Engine
from kvckpt_web.model.loader import load_model

from support.kvmodel import run

PROMPT = "the theory of the thing is that"


def completion_text(path, device, prompt: str, max_tokens: int) -> str:
    engine = Engine(load_model(path, device), device, config=PRESETS["desktop"].replace(sequences=1))
    try:
        return run(engine.complete(prompt, temperature=0.0, seed=0, max_tokens=max_tokens)).text
    finally:
        run(engine.close())


@pytest.mark.parametrize("model", ["tiny_base_path", "tiny_llama_path"], ids=["base model", "chat model"])
def test_raw_streams_the_plain_completion_of_the_prompt_and_saves_it(model, request, device, tmp_path, capsys):
    path = request.getfixturevalue(model)
    assert main(["generate", "--model", str(path), "--raw", "--prompt", PROMPT, "--temperature", "0",
                 "--max-tokens", "10", "--store", str(tmp_path / "s")]) == 0
    out, err = capsys.readouterr()
    assert out == completion_text(path, device, PROMPT, 10) + "\n"
    assert "saved as 'chat' generation" in err


def test_a_base_model_without_raw_is_refused_in_one_line_saying_so(tiny_base_path, tmp_path, capsys):
    assert main(["generate", "--model", str(tiny_base_path), "--prompt", "hi", "--store", str(tmp_path / "s")]) == 1
    error = capsys.readouterr().err.splitlines()[-1]
    assert error.startswith("kvckpt: error: messages: expected a chat model") and "a base model" in error
    assert "kvckpt generate --raw" in error
    assert not list((tmp_path / "s").iterdir())  # nothing saved


def test_raw_with_resume_is_refused_naming_the_flag(tmp_path, capsys):
    (tmp_path / "s").mkdir()
    assert main(["generate", "--raw", "--resume", "--store", str(tmp_path / "s")]) == 1
    assert capsys.readouterr().err.splitlines()[-1].startswith("kvckpt: error: --raw: expected no --raw with --resume")
