"""`kvckpt serve` run from a source checkout serves the wheel of that source, not a stale one."""

from __future__ import annotations

import io
import json
import re
import shutil
import subprocess
import sys
import urllib.request
import zipfile
from pathlib import Path

import pytest

import kvckpt_web
from kvckpt_web.server.wheel import source_checkout

SOURCE = Path(kvckpt_web.__file__).resolve().parent


def fetch(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=30) as r:
        return r.read()


def test_serve_from_a_checkout_serves_the_wheel_of_the_current_source(tmp_path):
    pyodide = tmp_path / "pyodide"
    pyodide.mkdir()
    (pyodide / "pyodide.mjs").write_text("export {}")
    stale = tmp_path / "wheels"
    stale.mkdir()
    (stale / "kvckpt_web-0.1.0-py3-none-any.whl").write_bytes(b"PK stale")
    (stale / "kvckpt_web-0.0.1-py3-none-any.whl").write_bytes(b"PK older")
    (stale / "micropip-0.11.1-py3-none-any.whl").write_bytes(b"PK micropip")
    server = subprocess.Popen([sys.executable, "-m", "kvckpt_web.cli", "serve", "--port", "0",
                               "--pyodide", str(pyodide), "--wheels", str(stale)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = server.stdout.readline()
        assert "http://127.0.0.1:" in line, server.stderr.read() if server.poll() is not None else line
        url = re.search(r"http://\S+/", line).group()
        index = json.loads(fetch(url + "wheels/index.json"))["wheels"]
        ours = [w for w in index if w.startswith("kvckpt_web-")]
        wheel = zipfile.ZipFile(io.BytesIO(fetch(url + "wheels/" + ours[0])))
    finally:
        server.terminate()
        server.wait(timeout=30)
    assert source_checkout() == SOURCE.parent
    assert len(ours) == 1 and "micropip-0.11.1-py3-none-any.whl" in index
    sources = sorted(p for p in SOURCE.rglob("*") if p.is_file() and p.suffix in (".py", ".mjs", ".html", ".md"))
    assert sources
    for path in sources:
        assert wheel.read(f"kvckpt_web/{path.relative_to(SOURCE).as_posix()}") == path.read_bytes(), path


def test_make_setup_alone_installs_hatchling_which_serve_page_builds_its_wheel_with():
    make = shutil.which("make") or pytest.skip("make is not installed")
    dry = subprocess.run([make, "-n", "-B", "setup"], cwd=SOURCE.parent, capture_output=True, text=True, timeout=60)
    assert dry.returncode == 0, dry.stderr
    assert any("pip install" in line and "hatchling" in line for line in dry.stdout.splitlines())
