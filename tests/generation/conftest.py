"""Fixtures of the generation tests: caches of a model's layout, for the test double of ``tests/model/lm_double.py``
(put on the path here, with ``runs.py`` beside this file, for every test of the folder)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "model"))

from kvckpt_web.model.caches import new_cache  # noqa: E402


@pytest.fixture
def make_cache(device):
    """``make_cache(model, page_size=4, prefill_chunk=8, max_tokens=None)``: a cache of the model's layout."""
    made = []

    def make(model, page_size=4, prefill_chunk=8, max_tokens=None):
        made.append(new_cache(model, device, max_tokens=max_tokens, prefill_chunk=prefill_chunk, page_size=page_size))
        return made[-1]

    yield make
    for cache in made:
        cache.close()
