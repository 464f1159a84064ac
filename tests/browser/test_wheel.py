"""The wheel (what a browser page installs) ships the package's non-Python files."""

from __future__ import annotations

import zipfile

from .browser_harness import REPO, build_wheel, unavailable


def test_wheel_ships_every_shader_under_kvckpt_web_shaders_and_the_page_files(tmp_path):
    try:
        import hatchling  # noqa: F401
    except ImportError:
        unavailable("hatchling in this environment (to build the kvckpt_web wheel offline)")
    names = set(zipfile.ZipFile(build_wheel(tmp_path)).namelist())
    shaders = {f"kvckpt_web/shaders/{p.relative_to(REPO / 'shaders').as_posix()}"
               for p in (REPO / "shaders").rglob("*.wgsl")}
    assert shaders >= {"kvckpt_web/shaders/kv/page_copy.wgsl", "kvckpt_web/shaders/kv/kv_append.wgsl"}
    assert shaders <= names, sorted(shaders - names)
    assert {"kvckpt_web/web/kvckpt.mjs", "kvckpt_web/web/engine.mjs", "kvckpt_web/web/engine-worker.mjs",
            "kvckpt_web/web/errors.mjs", "kvckpt_web/web/weights.mjs", "kvckpt_web/web/index.html", "kvckpt_web/durable/FORMAT.md"} <= names
