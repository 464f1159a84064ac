"""Where a checkpoint store is: a directory, an object storage URL, or the URL of a store ``kvckpt serve`` serves.

One function opens any of them, so every command that takes a store path takes a URL too.
"""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING

from ..errors import FieldError
from ..stores.file import FileStore
from ..stores.objects import SCHEMES as OBJECT_SCHEMES
from ..stores.objects import ObjectStore
from .keys import STORE_TOPS

if TYPE_CHECKING:
    from ..stores.base import Store

__all__ = ["HTTP_SCHEMES", "TOKEN_VARIABLE", "is_url", "open_location"]

HTTP_SCHEMES = ("http", "https")
"""Schemes of a store served by ``kvckpt serve --store``."""

TOKEN_VARIABLE = "KVCKPT_STORE_TOKEN"
"""The environment variable holding the bearer token of a served store, unless one is given."""


_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://")
"""What starts a URL (``scheme://``), of a scheme :func:`open_location` opens or not."""


def is_url(location: str) -> bool:
    """Whether ``location`` is a URL (``scheme://...``) rather than a directory path; :func:`open_location`
    refuses one of a scheme it does not open, so no URL is ever taken for a directory (``./ftp:``)."""
    return _SCHEME.match(location) is not None


def open_location(location: str, *, read_only: bool, new: bool = False, field: str = "store",
                  token: str | None = None, lease_seconds: float | None = None) -> "Store":
    """The checkpoint store at ``location``.

    * a directory path: a :class:`FileStore`; FormatError naming the path and what it holds unless it is a
      checkpoint store (with ``new``, a missing or empty directory too, where one is made);
    * ``s3://bucket/prefix``, ``gs://``, ``az://``, ``file://``, ``memory://``: an
      :class:`~kvckpt_web.stores.objects.ObjectStore` (endpoint and credentials from the environment: the usual
      ``AWS_*`` variables);
    * ``http://host:port/`` or ``https://``: an :class:`~kvckpt_web.stores.http.HTTPStore` of a store ``kvckpt
      serve --store`` serves, with bearer ``token`` (default: the variable :data:`TOKEN_VARIABLE`);
    * any other ``scheme://``: FieldError naming ``field`` and the scheme (never a directory of that name).

    ``lease_seconds``, if given, is how long the claims of an object store run unless renewed (its default
    otherwise); FieldError naming ``field`` for another store, whose claims are not leases it takes.
    """
    if not isinstance(location, str) or not location:
        raise FieldError(field, "a store directory or URL", location if isinstance(location, str) else
                         type(location).__name__, "'' would be the current directory" if location == "" else "")
    scheme = location.partition("://")[0].lower()
    if is_url(location) and scheme in HTTP_SCHEMES:
        from ..stores.http import HTTPStore

        return HTTPStore(location, token=token if token is not None else os.environ.get(TOKEN_VARIABLE),
                         read_only=read_only)
    if is_url(location) and scheme in OBJECT_SCHEMES:
        leased = {} if lease_seconds is None else {"lease_seconds": lease_seconds}
        return ObjectStore.from_url(location, read_only=read_only, **leased)
    if lease_seconds is not None:
        raise FieldError(field, f"an object storage URL ({', '.join(s + '://' for s in OBJECT_SCHEMES)}) with a "
                         "lease: other stores' claims are not leases taken here", location)
    if is_url(location):
        schemes = ", ".join(s + "://" for s in OBJECT_SCHEMES + HTTP_SCHEMES)
        raise FieldError(field, f"a store directory or a URL of {schemes}", location,
                         f"kvckpt opens no {scheme}:// store")
    FileStore.check_directory(location, STORE_TOPS, new=new)
    return FileStore(location, read_only=read_only)
