"""Running a server of ``kvckpt serve`` in the foreground until Ctrl-C."""

from __future__ import annotations

import sys
from typing import Any, Callable


def serve_until_interrupted(server: Any, exposure: str | None, start: Callable[[], None]) -> None:
    """Say ``exposure`` (what listening beyond loopback exposes; None on loopback) on stderr, run ``start``
    (its first lines, anything to do once it listens), then serve until Ctrl-C; the server is closed however
    it ends."""
    try:
        if exposure is not None:
            print(exposure, file=sys.stderr, flush=True)
        start()
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
