"""Running a server of ``kvckpt serve`` in the foreground until Ctrl-C."""

from __future__ import annotations

import sys
from typing import Any, Callable


def serve_until_interrupted(server: Any, address: Any, start: Callable[[], None],
                            exposure: Callable[[int], str] | None = None) -> None:
    """Serve ``server``, bound at ``address`` (a :class:`~kvckpt_web.server.hosts.BindAddress`), until Ctrl-C:
    beyond loopback first say on stderr what that exposes (``exposure(port)``, default ``address.exposure``),
    then run ``start`` (its first lines, anything to do once it listens); the server is closed however it ends."""
    try:
        if not address.loopback:
            print((exposure or address.exposure)(server.server_address[1]), file=sys.stderr, flush=True)
        start()
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
