"""Fixtures of the engine tests: engines over the K/V-honest test double of ``tests/model/lm_double.py``.

``make_engine(store=None, **kwargs)`` builds an engine (closed after the test); a second engine on the same store
is what a restarted process is.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "model"))

from kvckpt_web.engine import Engine, EngineConfig  # noqa: E402
from kvckpt_web.model.protocol import LoadedModel  # noqa: E402

from lm_double import DoubleLM, DoubleText  # noqa: E402
from support.kvmodel import run  # noqa: E402

SMALL = EngineConfig(context=768, sequences=3, page_size=4, prefill_chunk=8, autosave_every=5, chunk_tokens=16)
"""The tests' engine: small pages and chunks, so that a few words span several."""
SETTINGS = {f.name for f in dataclasses.fields(EngineConfig)}


@pytest.fixture
def make_engine(device):
    """``make_engine(store=None, model=None, text=None, on=None, **engine_kwargs)``: an engine on the double
    (on the session's device, or ``on``); the fields of :class:`EngineConfig` among ``engine_kwargs`` replace
    those of :data:`SMALL`."""
    made = []

    def make(store=None, model=None, text=None, on=None, **kwargs):
        loaded = LoadedModel(model or DoubleLM(max_context=1024), text or DoubleText())
        config = SMALL.replace(**{key: kwargs.pop(key) for key in SETTINGS & kwargs.keys()})
        made.append(Engine(loaded, on or device, store=store, model_name="double", config=config, **kwargs))
        return made[-1]

    yield make
    for engine in made:
        run(engine.close())
