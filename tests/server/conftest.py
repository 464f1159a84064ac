"""Fixtures of the server tests."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def pyodide(tmp_path: Path) -> Path:
    """A stand-in for the npm package pyodide: a folder with a ``pyodide.mjs`` (what the server checks)."""
    pyo = tmp_path / "pyodide"
    pyo.mkdir()
    (pyo / "pyodide.mjs").write_text("export {}")
    return pyo
