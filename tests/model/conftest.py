"""Fixtures of the model tests: the real SmolLM2-135M-Instruct GGUF (``smollm_path``, tests/conftest.py) parsed
once (the tiny random llama GGUF, ``tiny_llama_path``, is in tests/conftest.py), and each way the quantized
products are built (``flavour``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvckpt_web.model import kernels
from kvckpt_web.model.gguf import GGUFFile, open_gguf


@pytest.fixture(scope="session")
def smollm(smollm_path: Path) -> GGUFFile:
    """The SmolLM2 GGUF, mapped and parsed by kvckpt_web's reader."""
    return open_gguf(smollm_path)


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
