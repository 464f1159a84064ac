"""The kvckpt_web wheel of a source checkout: what ``kvckpt serve`` serves before any older wheel."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from ..errors import KVCkptError


def source_checkout() -> Path | None:
    """The source tree this package runs from (``pyproject.toml`` beside the package), or None when it runs
    from an installed wheel."""
    root = Path(__file__).resolve().parents[2]
    return root if (root / "pyproject.toml").is_file() else None


def build_wheel(source: str | os.PathLike[str], out: str | os.PathLike[str]) -> Path:
    """Build the kvckpt_web wheel of the source tree ``source`` into directory ``out`` and return its path
    (hatchling from this environment, no build isolation, no network). KVCkptError if the build fails."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                            "--no-index", "-w", str(out), str(source)], capture_output=True, text=True)
    wheels = sorted(out.glob("kvckpt_web-*.whl"))
    if build.returncode != 0 or not wheels:
        raise KVCkptError(f"wheel of {source}: expected a kvckpt_web wheel built by pip (hatchling installed), "
                          f"got exit status {build.returncode}: {' '.join(build.stderr.split())[-500:]}")
    return wheels[-1]
