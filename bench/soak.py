"""Crash soak (``make soak``): kill -9 processes that are saving, at random points, and check that every
restore returns exactly the previous or the new generation. Same as ``kvckpt bench soak``.
Run from the repository root: ``.venv/bin/python bench/soak.py [--trials N]``.
"""

from __future__ import annotations

import sys

from kvckpt_web.cli.main import main

if __name__ == "__main__":
    sys.exit(main(["bench", "soak", *(sys.argv[1:] or ["--trials", "200"])]))
