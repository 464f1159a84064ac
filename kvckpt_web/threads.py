"""CPU-heavy work kept off the event loop: on a worker thread where threads exist, inline in the browser
(Pyodide has none)."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from typing import Any

__all__ = ["IN_BROWSER", "offload"]

IN_BROWSER = sys.platform == "emscripten"
"""Whether this is Pyodide in a browser, where there are no threads."""


async def offload(fn: Callable[..., Any], *args: Any) -> Any:
    """Run CPU-heavy ``fn`` (hashing, which releases the GIL) in a worker thread where threads exist."""
    if IN_BROWSER:
        return fn(*args)
    return await asyncio.to_thread(fn, *args)
