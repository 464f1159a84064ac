"""Fixtures of the server tests: a stand-in Pyodide, and the tiny random llama for the API's engine."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from kvckpt_web.engine import PRESETS, Engine
from kvckpt_web.model.loader import load_model
from kvckpt_web.model.protocol import LoadedModel
from kvckpt_web.server.worker import DEFAULT_QUEUE, EngineWorker


@pytest.fixture
def pyodide(tmp_path: Path) -> Path:
    """A stand-in for the npm package pyodide: a folder with a ``pyodide.mjs`` (what the server checks)."""
    pyo = tmp_path / "pyodide"
    pyo.mkdir()
    (pyo / "pyodide.mjs").write_text("export {}")
    return pyo


@pytest.fixture(scope="session")
def tiny_llama_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random llama GGUF with ChatML's special tokens (tests/model/tiny_llama.py), written once."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "model"))
    from tiny_llama import write_tiny_llama

    return write_tiny_llama(tmp_path_factory.mktemp("tiny-llama") / "tiny.gguf")


@pytest.fixture(scope="session")
def tiny_llama(tiny_llama_path: Path, device) -> LoadedModel:
    """The tiny llama, loaded once on the session's device (engines of the tests share it)."""
    return load_model(tiny_llama_path, device)


@pytest.fixture
def make_worker(tiny_llama: LoadedModel, device):
    """``make_worker(store=None, model=None, queue=DEFAULT_QUEUE, **settings)``: an engine named ``tiny`` on the tiny llama (or
    ``model``, e.g. a gated one) on its own thread, its ``settings`` over the ``desktop`` preset's (what
    ``kvckpt serve --api`` runs); closed after the test."""
    made = []

    def make(store=None, model=None, queue=DEFAULT_QUEUE, **settings):
        loaded = LoadedModel(model or tiny_llama.model, tiny_llama.text)
        config = PRESETS["desktop"].replace(**settings)
        made.append(EngineWorker(lambda: Engine(loaded, device, store=store, model_name="tiny", config=config),
                                 queue=queue))
        return made[-1]

    yield make
    for worker in made:
        worker.close()
