"""Fixtures of the model tests: the real SmolLM2-135M-Instruct GGUF (``smollm_path``, tests/conftest.py) parsed
once, the tiny random llama GGUF, and caches of a model's layout."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvckpt_web.model.gguf import GGUFFile, open_gguf
from kvckpt_web.model.generator import new_cache


@pytest.fixture(scope="session")
def smollm(smollm_path: Path) -> GGUFFile:
    """The SmolLM2 GGUF, mapped and parsed by kvckpt_web's reader."""
    return open_gguf(smollm_path)


@pytest.fixture(scope="session")
def tiny_llama_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random llama GGUF (tests/model/tiny_llama.py), written once per session."""
    from tiny_llama import write_tiny_llama

    return write_tiny_llama(tmp_path_factory.mktemp("tiny-llama") / "tiny.gguf")


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
