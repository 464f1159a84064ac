"""The scripts in examples/ run as a user would run them, and check what they claim."""

from __future__ import annotations

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
