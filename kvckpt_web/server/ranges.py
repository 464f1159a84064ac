"""Byte ranges of a served file, as RFC 9110 section 14 defines them.

One range (``bytes=a-b``, ``bytes=a-``, ``bytes=-n``) is answered 206 with its ``Content-Range``; a range
that selects nothing (it starts at or past the end, or ``bytes=-0``) 416 with ``Content-Range: bytes */size``.
A Range header that is malformed, of another unit, with ``last < first``, or asking for several ranges is
ignored: the whole file is answered 200 (RFC 9110 lets a server ignore any Range; it must ignore one it
does not understand), so no multipart answer is ever made. ``If-Range`` with a validator that no longer
matches also yields the whole file. A file is streamed in chunks, never read whole.
"""

from __future__ import annotations

import re

from starlette.responses import FileResponse
from starlette.types import Receive, Scope, Send

_SPEC = re.compile(r"([0-9]*)-([0-9]*)")
_OWS = " \t"


def requested_range(values: list[str], size: int) -> range | None:
    """The bytes of a ``size``-byte file that the Range header field lines ``values`` ask for: None to answer
    the whole file (no Range, or one to ignore), an empty range if unsatisfiable (answer 416)."""
    if not values:
        return None
    unit, equals, specs = ",".join(values).partition("=")
    if not equals or unit.lower() != "bytes":
        return None
    parts = [p.strip(_OWS) for p in specs.split(",")]
    parts = [p for p in parts if p]  # a list may hold empty elements (RFC 9110 section 5.6.1)
    spec = _SPEC.fullmatch(parts[0]) if len(parts) == 1 else None
    if spec is None or spec.group() == "-":
        return None
    first, last = (_number(g) if g else None for g in spec.groups())
    if first is None:  # bytes=-n: the last n bytes
        return range(max(size - last, 0), size) if last > 0 else range(0)
    if last is not None and last < first:
        return None
    return range(first, size if last is None else min(last + 1, size)) if first < size else range(0)


def _number(digits: str) -> int:
    """``digits`` as an integer; one beyond any file size as 10**24 (int() refuses over 4300 digits)."""
    digits = digits.lstrip("0") or "0"
    return int(digits) if len(digits) <= 24 else 10**24


class RangedFileResponse(FileResponse):
    """Starlette's FileResponse (needs ``stat_result``) answering a Range as :func:`requested_range` decides:
    Starlette streams the range decided here, named to it in a form it reads alike, or the whole file, and
    answers ``If-Range`` (a strong validator: ETag or Last-Modified) and 416 itself."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = [(name, value) for name, value in scope["headers"] if name != b"range"]
        size = self.stat_result.st_size
        wanted = requested_range([value.decode("latin-1") for name, value in scope["headers"] if name == b"range"],
                                 size)
        if wanted is not None:
            canonical = f"bytes={wanted.start}-{wanted.stop - 1}" if wanted else f"bytes={size}-"
            headers.append((b"range", canonical.encode("latin-1")))
        await super().__call__({**scope, "headers": headers}, receive, send)
