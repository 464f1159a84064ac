"""The pure-Python parts of the suite pass inside Pyodide (npm package, Python 3.14) under Node."""

from __future__ import annotations

import shutil
import subprocess

from .browser_harness import REPO, build_wheel, pyodide_dir, unavailable, wheels_dir

PURE_TESTS = ["tests/tvm/test_layout.py", "tests/tvm/test_metadata.py", "tests/durable/test_container.py",
              "tests/kv/test_pool.py", "tests/stores/test_store.py::TestMemoryStore", "tests/model/test_sampler.py"]
WHEELS = ["pytest", "pluggy", "iniconfig", "packaging", "pygments", "hypothesis", "attrs", "sortedcontainers"]


def test_pure_python_suite_in_pyodide_under_node(tmp_path):
    node = shutil.which("node")
    if node is None:
        unavailable("node (Node.js >= 20)")
    pyo = pyodide_dir()
    if not (pyo / "pyodide.mjs").is_file():
        unavailable(f"the npm package pyodide in {pyo} (make web-deps)")
    try:
        import hatchling  # noqa: F401
    except ImportError:
        unavailable("hatchling in this environment (to build the kvckpt_web wheel offline)")
    wheels = []
    for name in WHEELS:
        found = sorted(wheels_dir().glob(f"{name}-*.whl"))
        if not found:
            unavailable(f"a pure {name} wheel in {wheels_dir()} (make web-deps)")
        wheels.append(str(found[-1]))
    ours = build_wheel(tmp_path / "wheel")
    args = ["-q", "--noconftest", "-p", "tests.pyodide.pyodide_plugin", *PURE_TESTS]
    proc = subprocess.run([node, "--experimental-wasm-stack-switching", str(REPO / "tests/pyodide/run_tests.mjs"),
                           str(pyo), str(REPO / "tests"), str(ours), *wheels, "--", *args],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    tail = (proc.stdout + proc.stderr)[-3000:]
    assert proc.returncode == 0, tail
    assert "Python 3.14" in proc.stdout and "on emscripten" in proc.stdout, tail
    assert " passed" in proc.stdout and "failed" not in proc.stdout, tail
