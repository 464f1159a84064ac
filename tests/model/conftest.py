"""Fixtures of the model tests: the real SmolLM2-135M-Instruct GGUF (``smollm_path``, tests/conftest.py) parsed
once, caches of a model's layout (the tiny random llama GGUF, ``tiny_llama_path``, is in tests/conftest.py), and
each way the quantized products are built (``flavour``)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kvckpt_web.model import kernels
from kvckpt_web.model.gguf import GGUFFile, open_gguf
from kvckpt_web.model.caches import new_cache


@pytest.fixture(scope="session")
def smollm(smollm_path: Path) -> GGUFFile:
    """The SmolLM2 GGUF, mapped and parsed by kvckpt_web's reader."""
    return open_gguf(smollm_path)


@pytest.fixture(scope="session")
def gemma_path() -> Path:
    """The Gemma 3 270M Q4_K_M GGUF that ``$KVCKPT_GEMMA_GGUF`` names (skip when it names none)."""
    path = os.environ.get("KVCKPT_GEMMA_GGUF")
    if not path:
        pytest.skip("KVCKPT_GEMMA_GGUF does not name the Gemma 3 270M GGUF")
    return Path(path)


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


@pytest.fixture(params=sorted(kernels.FLAVOURS))
def flavour(device, request):  # type: ignore[no-untyped-def]
    """The products built as on the desktop (storage textures, shifted bytes) or as in the browser (sampled textures,
    masked bytes), for the test."""
    before = device.choices.get(kernels.FLAVOUR)
    device.choices[kernels.FLAVOUR] = request.param
    yield request.param
    if before is None:
        del device.choices[kernels.FLAVOUR]
    else:
        device.choices[kernels.FLAVOUR] = before
