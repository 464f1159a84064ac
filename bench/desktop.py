"""Desktop benchmarks (``make bench``): the same tables as ``kvckpt bench export save``.

Export/import of a 4096-token, 256 MiB sequence vs raw readback/upload of one contiguous buffer, and
durable save/restore to disk vs raw write+fsync / read+upload, measured side by side in one run.
Run from the repository root: ``.venv/bin/python bench/desktop.py [export] [save] [--repeats N]``.
"""

from __future__ import annotations

import sys

from kvckpt_web.cli.main import main

if __name__ == "__main__":
    sys.exit(main(["bench", *(sys.argv[1:] or ["export", "save"])]))
