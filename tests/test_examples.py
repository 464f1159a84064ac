"""The scripts in examples/ run as a user would run them, and check what they claim; the chat page's modules
(examples/chat, driven in a browser by tests/browser) are read as text for how they are put together."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def run_example(name: str, *args: str) -> str:
    proc = subprocess.run([sys.executable, str(EXAMPLES / name), *args], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


@pytest.mark.usefixtures("device")  # skips, or fails under KVCKPT_REQUIRE_GPU=1, without an adapter
def test_quickstart_restores_identical_kv(tmp_path):
    out = run_example("quickstart.py", str(tmp_path / "store"))
    assert "K/V identical: True" in out
    assert (tmp_path / "store" / "manifests" / "chat").is_dir()


@pytest.mark.usefixtures("device")
def test_tvm_export_example_writes_a_directory_that_loads_back(tmp_path):
    out = run_example("tvm_export.py", str(tmp_path / "export"))
    assert "re-export identical: True" in out
    assert sorted(p.name for p in (tmp_path / "export").iterdir())[:3] == ["group_0.bin", "group_1.bin", "group_10.bin"]


@pytest.mark.usefixtures("device")
def test_autosave_example_writes_only_the_changed_chunks(tmp_path):
    out = run_example("autosave.py", str(tmp_path / "store"))
    assert "save 1: 1024 tokens, wrote 32 of 32 chunks" in out
    assert out.count("wrote 4 of 36 chunks") == 4
    assert "K/V identical: True; generations kept: [3, 4, 5]" in out


def test_every_example_has_a_test():
    tested = {"quickstart.py", "tvm_export.py", "autosave.py"}
    assert {p.name for p in EXAMPLES.glob("*.py")} == tested


CHAT = EXAMPLES / "chat"


def chat_imports() -> dict[str, set[str]]:
    """Each module of the chat page and the page's modules it imports."""
    return {p.name: set(re.findall(r'^import [^;]*? from "\./([\w-]+\.mjs)";', p.read_text(), re.M))
            for p in CHAT.glob("*.mjs")}


def test_the_chat_pages_modules_import_each_other_without_a_circle():
    imports, done = chat_imports(), set()
    assert imports["app.mjs"] >= {"page.mjs", "conversations.mjs", "replies.mjs"}  # the parse finds imports

    def visit(name: str, path: tuple[str, ...]) -> None:
        assert name not in path, " -> ".join((*path, name))
        if name not in done:
            for imported in imports[name]:
                visit(imported, (*path, name))
            done.add(name)

    for name in imports:
        visit(name, ())


def test_the_chat_page_shares_no_state_through_window_but_the_page_object_it_shows_tests():
    assigned = {name for p in CHAT.glob("*.mjs") for name in re.findall(r"window\.(\w+)\s*=[^=]", p.read_text())}
    assert assigned == {"chatPage"}
