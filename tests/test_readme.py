"""Every Python snippet of README.md runs as written (the JS ones: tests/browser/test_readme_js.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from readme_snippets import NEEDS_API, snippets

PYTHON = [s for s in snippets("python") if not s.startswith(NEEDS_API)]


def test_the_readme_has_a_python_quick_start():
    assert PYTHON and "from kvckpt_web import" in PYTHON[0]


@pytest.mark.parametrize("source", PYTHON, ids=[f"block{i}" for i in range(len(PYTHON))])
def test_python_snippet_runs_as_written(source, device, tmp_path):
    run = subprocess.run([sys.executable, "-c", source], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
