"""``kvckpt chat``'s flags and store: checked before the model loads, refused in one line naming the flag."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvckpt_web.cli import chat
from kvckpt_web.cli.main import main
from kvckpt_web.errors import DeviceError


@pytest.fixture
def no_model(monkeypatch):
    """Loading the model fails the test: every refusal here comes before it."""
    monkeypatch.setattr(chat, "load_model", lambda *a: pytest.fail("loaded the model"))
    monkeypatch.setattr(chat, "open_device", lambda *a: pytest.fail("opened the device"))


def no_device():
    raise DeviceError("no device in this test")


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err
    assert err.startswith("kvckpt: error: ") and err.count("\n") == 1, err
    return err


@pytest.mark.parametrize("argv, flag", [
    (["--temperature", "3"], "--temperature"), (["--top-p", "0"], "--top-p"), (["--top-k", "-1"], "--top-k"),
    (["--seed", "-1"], "--seed"), (["--repetition-penalty", "0"], "--repetition-penalty"),
    (["--max-tokens", "0"], "--max-tokens"), (["--context", "1"], "--context"),
    (["--autosave-every", "0"], "--autosave-every"), (["--conversation", "../up"], "--conversation"),
    (["--system", "half a pair \udcff"], "--system"),
])
def test_a_bad_flag_is_one_line_naming_it_before_the_model_loads(no_model, tmp_path, capsys, argv, flag):
    assert main(["chat", "--store", str(tmp_path / "chats"), *argv]) == 1
    assert f"kvckpt: error: {flag}: expected" in one_line_error(capsys)
    assert not (tmp_path / "chats").exists()


def test_a_store_that_is_a_directory_of_other_files_is_refused_before_the_model_loads(no_model, tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("mine")
    assert main(["chat", "--store", str(tmp_path)]) == 1
    assert "a directory holding notes.txt" in one_line_error(capsys)


def test_the_default_store_is_under_xdg_data_home(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    assert chat.default_store() == tmp_path / "kvckpt" / "chats"


@pytest.mark.parametrize("value", ["", "relative/dir"])
def test_the_default_store_is_under_the_home_directory_without_an_absolute_xdg_data_home(monkeypatch, tmp_path,
                                                                                        value):
    monkeypatch.setenv("XDG_DATA_HOME", value)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert chat.default_store() == tmp_path / ".local" / "share" / "kvckpt" / "chats"


def test_the_default_store_is_made_readable_by_its_user_only(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    monkeypatch.setattr(chat, "open_device", no_device)
    assert main(["chat"]) == 1  # the device (refused here) is opened after the store is made
    assert (Path(tmp_path) / "kvckpt" / "chats").stat().st_mode & 0o777 == 0o700


def test_a_context_over_the_models_is_refused_naming_it_not_clamped(monkeypatch, tmp_path, capsys):
    from lm_double import DoubleLM, DoubleText

    from kvckpt_web.model.protocol import LoadedModel

    monkeypatch.setattr(chat, "open_device", lambda: None)
    monkeypatch.setattr(chat, "load_model", lambda path, device: LoadedModel(DoubleLM(), DoubleText()))
    assert main(["chat", "--store", str(tmp_path / "chats"), "--model", "double.gguf", "--context", "99999999"]) == 1
    assert capsys.readouterr().err.splitlines()[-1] == (
        "kvckpt: error: --context: expected at most 96 tokens (the model's context), got 99999999")


def test_a_base_model_is_refused_in_one_line_saying_so_before_the_chat_opens(tiny_base_path, tmp_path, capsys):
    assert main(["chat", "--store", str(tmp_path / "chats"), "--model", str(tiny_base_path)]) == 1
    error = capsys.readouterr().err.splitlines()[-1]
    assert error.startswith("kvckpt: error: messages: expected a chat model") and "a base model" in error
    assert "kvckpt generate --raw" in error
