"""Fixtures of the model tests: the real SmolLM2-135M-Instruct GGUF (``smollm_path``, tests/conftest.py) parsed
once, and caches of a model's layout (the tiny random llama GGUF, ``tiny_llama_path``, is in tests/conftest.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvckpt_web.model.gguf import GGUFFile, open_gguf
from kvckpt_web.model.generator import new_cache


@pytest.fixture(scope="session")
def smollm(smollm_path: Path) -> GGUFFile:
    """The SmolLM2 GGUF, mapped and parsed by kvckpt_web's reader."""
    return open_gguf(smollm_path)


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
