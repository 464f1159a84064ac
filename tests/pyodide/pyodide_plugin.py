"""pytest plugin for running the suite inside Pyodide under Node (used instead of tests/conftest.py).

There is no WebGPU (and no numpy) in Node's Pyodide, so the GPU fixtures skip.
"""

import sys
from pathlib import Path

import pytest

# The shared helpers (support.store_suite, support.kvmodel, ...) import from tests/, as pyproject's ``pythonpath``
# makes them on desktop; pyproject is not mounted here.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


@pytest.fixture
def device():
    pytest.skip("no WebGPU device in Pyodide under Node")


@pytest.fixture
def make_cache(device):
    pytest.skip("no WebGPU device in Pyodide under Node")


@pytest.fixture
def make_model(device):
    pytest.skip("no WebGPU device in Pyodide under Node")


def _stub_kvmodel() -> None:
    """tests/support/kvmodel.py needs numpy (absent here); its helpers serve GPU tests only, which skip anyway."""
    import asyncio
    import sys
    import types

    try:
        import numpy  # noqa: F401
        return
    except ImportError:
        pass
    stub = types.ModuleType("support.kvmodel", "numpy-free stand-in for tests/support/kvmodel.py inside Pyodide")
    stub.run = asyncio.run

    def _missing(name):
        def helper(*args, **kwargs):
            pytest.skip(f"support.kvmodel.{name} needs numpy (not in Pyodide)")
        return helper

    stub.__getattr__ = _missing
    sys.modules.setdefault("support.kvmodel", stub)


_stub_kvmodel()
