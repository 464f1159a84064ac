"""The engine each ``kvckpt`` command runs: the ``desktop`` preset, with the fields its flags give replaced (and
for ``kvckpt generate``, one sequence of the model's context), read back from the engine it built.

The model is the test double (96 tokens of context), given through each command's loader seam; ``kvckpt serve
--api``'s engine is read back in ``tests/server/test_api_cli.py``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from kvckpt_web.cli import chat, generate
from kvckpt_web.cli.main import main
from kvckpt_web.engine import PRESETS
from kvckpt_web.model.protocol import LoadedModel

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "model"))
from lm_double import DoubleLM, DoubleText  # noqa: E402

DESKTOP = PRESETS["desktop"]


@pytest.fixture
def built(monkeypatch, device, tmp_path):
    """The engines the commands build (each closed before its command ends), on the double."""
    engines = []
    for command in (chat, generate):
        monkeypatch.setattr(command, "open_device", lambda: device)
        monkeypatch.setattr(command, "load_model", lambda path, device: LoadedModel(DoubleLM(), DoubleText()))

    async def reply(engine, *args):
        engines.append(engine)
        await engine.close()

    class Session:
        def __init__(self, engine, *args, **kwargs) -> None:
            self.engine = engine
            engines.append(engine)

        async def run(self, conversation):
            pass

    monkeypatch.setattr(generate, "_reply", reply)
    monkeypatch.setattr(chat, "ChatSession", Session)
    (tmp_path / "double.gguf").write_bytes(b"")
    return engines


def test_generate_runs_the_desktop_preset_in_one_sequence_of_the_models_context(built, tmp_path):
    assert main(["generate", "--model", str(tmp_path / "double.gguf"), "--prompt", "hi"]) == 0
    assert built[0].config == DESKTOP.replace(context=96, sequences=1, cache_tokens=96)


def test_generates_flags_replace_the_presets_fields(built, tmp_path):
    assert main(["generate", "--model", str(tmp_path / "double.gguf"), "--prompt", "hi", "--context", "64",
                 "--prefill-chunk", "16", "--autosave-every", "3"]) == 0
    assert built[0].config == DESKTOP.replace(context=64, sequences=1, cache_tokens=64, prefill_chunk=16,
                                              autosave_every=3)


def test_chat_runs_the_desktop_preset_fitted_to_the_model(built, tmp_path):
    assert main(["chat", "--model", str(tmp_path / "double.gguf"), "--store", str(tmp_path / "chats")]) == 0
    assert built[0].config == DESKTOP.fitted(96)


def test_chats_flags_replace_the_presets_fields(built, tmp_path):
    assert main(["chat", "--model", str(tmp_path / "double.gguf"), "--store", str(tmp_path / "chats"),
                 "--context", "64", "--autosave-every", "3"]) == 0
    assert built[0].config == DESKTOP.replace(context=64, autosave_every=3).fitted(96)
