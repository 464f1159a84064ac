"""The ``device`` fixture's policy: skip GPU tests without an adapter, fail them when KVCKPT_REQUIRE_GPU=1."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
GPU_TEST = "kv/test_cache.py::test_new_cache_has_no_sequences_and_every_page_free"
NO_ADAPTER_PLUGIN = '''
import kvckpt_web
from kvckpt_web.errors import DeviceError


def _no_adapter(*args, **kwargs):
    raise DeviceError("no WebGPU adapter available (simulated)")


kvckpt_web.open_device = _no_adapter
'''


def run_without_adapter(tmp_path: Path, require_gpu: str | None) -> subprocess.CompletedProcess:
    (tmp_path / "no_adapter_plugin.py").write_text(NO_ADAPTER_PLUGIN)
    env = {k: v for k, v in os.environ.items() if k != "KVCKPT_REQUIRE_GPU"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tmp_path), env.get("PYTHONPATH")]))
    if require_gpu is not None:
        env["KVCKPT_REQUIRE_GPU"] = require_gpu
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no_adapter_plugin", "-p", "no:cacheprovider",
                           "-rs", GPU_TEST], cwd=TESTS, env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("require_gpu", [None, "0"])
def test_gpu_tests_skip_without_an_adapter(tmp_path, require_gpu):
    result = run_without_adapter(tmp_path, require_gpu)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 skipped" in result.stdout and "no WebGPU adapter" in result.stdout


def test_gpu_tests_fail_without_an_adapter_when_a_gpu_is_required(tmp_path):
    result = run_without_adapter(tmp_path, "1")
    assert result.returncode != 0
    assert "1 error" in result.stdout and "KVCKPT_REQUIRE_GPU=1" in result.stdout
    assert "skipped" not in result.stdout
