"""Fixtures of the model tests: the real SmolLM2-135M-Instruct GGUF (``smollm_path``, tests/conftest.py) parsed
once, the tiny random llama GGUF, and each way the quantized products are built (``flavour``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvckpt_web.model import kernels
from kvckpt_web.model.gguf import GGUFFile, open_gguf


@pytest.fixture(scope="session")
def smollm(smollm_path: Path) -> GGUFFile:
    """The SmolLM2 GGUF, mapped and parsed by kvckpt_web's reader."""
    return open_gguf(smollm_path)


@pytest.fixture(scope="session")
def tiny_llama_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random llama GGUF (tests/model/tiny_llama.py), written once per session."""
    from tiny_llama import write_tiny_llama

    return write_tiny_llama(tmp_path_factory.mktemp("tiny-llama") / "tiny.gguf")


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
