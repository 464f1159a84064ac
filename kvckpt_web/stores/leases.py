"""Claims held as leases, where no lock reaches every writer (object storage, a store ``kvckpt serve`` serves):
what a claim object holds, until when one holds its name, and the leases one store object holds.

A lease runs for a number of seconds from just before the request that took or renewed it, by the holder's
clock; its holder renews it once half of that has passed (:meth:`~kvckpt_web.stores.base.Store.renew_claim`,
which every save calls), and another writer takes the name over only once it has run out. In object storage the
claim of name ``n`` is the object ``~kvckpt.claim.<n>`` beside the store's keys, written only if absent or
unchanged since it was read (conditional PUTs): ``kvckpt_web/durable/FORMAT.md`` section 10 specifies it.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from ..checks import check_seconds
from ..errors import FieldError, is_int
from ..jsontext import unique_keys

__all__ = ["CLAIM_FORMAT", "CLAIM_VERSION", "CLOCK_SKEW_SECONDS", "DEFAULT_LEASE_SECONDS", "MAX_CLAIM_BYTES",
           "MAX_LEASE_SECONDS", "MAX_WRITER_CHARS", "ClaimValue", "Lease", "Leases", "check_lease_seconds",
           "check_writer", "claim_runs_until", "decode_claim", "default_writer", "encode_claim", "is_holder",
           "is_writer", "new_holder"]

DEFAULT_LEASE_SECONDS = 30.0
"""How long a claim held as a lease runs unless renewed."""

MAX_LEASE_SECONDS = 3600.0
"""The longest lease a writer takes: no claim object holds its name longer after it was last written."""

CLOCK_SKEW_SECONDS = 10.0
"""How far the clocks of writers (and the storage's last-modified times) may disagree: a claimer takes a name
over only this long after the claim there ran out by its own clock."""

CLAIM_FORMAT = "kvckpt.claim"
CLAIM_VERSION = 1
MAX_CLAIM_BYTES = 1024
"""The longest claim object a claimer reads; a longer one is no claim of this version."""

MAX_WRITER_CHARS = 128
"""The longest ``writer`` a claim object names (in characters)."""

_HOLDER_RE = re.compile(r"[0-9a-f]{32}")
_KEYS = frozenset({"expires_ms", "format", "holder", "name", "version"})


def new_holder() -> str:
    """A holder id of a claim: 32 random lowercase hex digits, drawn for each claim taken."""
    return secrets.token_hex(16)


def is_holder(value: Any) -> bool:
    """Whether ``value`` is a holder id (32 lowercase hex digits)."""
    return isinstance(value, str) and _HOLDER_RE.fullmatch(value) is not None


def default_writer() -> str:
    """Who a claim names as its writer unless told: this machine's host name and this process's id."""
    return f"{socket.gethostname()} pid {os.getpid()}"[:MAX_WRITER_CHARS]


def is_writer(value: Any) -> bool:
    """Whether ``value`` can be a claim's ``writer``: 1 to :data:`MAX_WRITER_CHARS` printable characters."""
    return isinstance(value, str) and 0 < len(value) <= MAX_WRITER_CHARS and value.isprintable()


def check_writer(field: str, value: Any) -> str:
    """``value`` if it can be a claim's ``writer`` (see :func:`is_writer`)."""
    if not is_writer(value):
        raise FieldError(field, f"1 to {MAX_WRITER_CHARS} printable characters (who holds a claim)", value)
    return value


def check_lease_seconds(field: str, value: Any) -> float:
    """``value`` as a float if it is a lease length: more than 0 and at most :data:`MAX_LEASE_SECONDS`."""
    seconds = check_seconds(field, value)
    if not 0 < seconds <= MAX_LEASE_SECONDS:
        raise FieldError(field, f"a lease of more than 0 and at most {MAX_LEASE_SECONDS:g} seconds", value)
    return seconds


@dataclass(frozen=True)
class ClaimValue:
    """What a claim object says: whose the claim of ``name`` is, and until when (Unix time, milliseconds);
    ``writer`` names the process that holds it for people (None: a claim that names none)."""

    name: str
    holder: str
    expires_ms: int
    writer: str | None = None


def encode_claim(value: ClaimValue) -> bytes:
    """The bytes of a claim object: compact JSON, keys sorted, UTF-8."""
    body = {"expires_ms": value.expires_ms, "format": CLAIM_FORMAT, "holder": value.holder, "name": value.name,
            "version": CLAIM_VERSION}
    if value.writer is not None:
        body["writer"] = value.writer
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def decode_claim(name: str, data: bytes) -> ClaimValue | None:
    """The claim of ``name`` that ``data`` holds; None if it is none by the rules of version 1 (too long, not
    UTF-8 JSON of exactly the keys, ``writer`` optional, another format, version or name, a field that breaks its
    rule)."""
    if len(data) > MAX_CLAIM_BYTES:
        return None
    try:
        body = json.loads(data.decode("utf-8"), object_pairs_hook=unique_keys)
    except ValueError:  # UnicodeDecodeError and duplicate keys included
        return None
    if (not isinstance(body, dict) or body.keys() - {"writer"} != _KEYS or body["format"] != CLAIM_FORMAT
            or not is_int(body["version"], CLAIM_VERSION, CLAIM_VERSION) or body["name"] != name
            or not is_holder(body["holder"]) or not is_int(body["expires_ms"], 0, 2**53 - 1)
            or ("writer" in body and not is_writer(body["writer"]))):
        return None
    return ClaimValue(name, body["holder"], body["expires_ms"], body.get("writer"))


def claim_runs_until(value: ClaimValue | None, last_modified: float) -> float:
    """Until when (Unix time, seconds) a claim object last written at ``last_modified`` holds its name: its
    ``expires_ms``, never later than :data:`MAX_LEASE_SECONDS` after it was written; an object that is no claim
    (``value`` None) that long after it was written."""
    bound = last_modified + MAX_LEASE_SECONDS
    return bound if value is None else min(value.expires_ms / 1000, bound)


@dataclass
class Lease:
    """A claim a store object holds: its holder id, when it was taken or last renewed (by the store's clock) and
    for how long, and what its next renewal is conditional on (an ETag; None where the holder id is enough)."""

    holder: str
    started: float
    seconds: float
    tag: str | None
    renewing: bool = False
    """A renewal of it is under way."""

    @property
    def expires_at(self) -> float:
        return self.started + self.seconds

    def expires_ms(self) -> int:
        return int(self.expires_at * 1000)


class Leases:
    """The leases one store object holds, by name, timed by its ``clock`` (seconds, Unix time)."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self._held: dict[str, Lease] = {}

    def hold(self, name: str, lease: Lease) -> None:
        """Record ``lease`` as this object's claim of ``name``."""
        self._held[name] = lease

    async def renew(self, name: str, put: Callable[[Lease], Awaitable[bool]]) -> bool:
        """Renew this object's lease of ``name`` with ``put`` (which writes it anew and updates the lease, or says
        False: another writer took the name over) if half of it has passed and no renewal of it is under way (the
        writes of one save run at once: one renews, the others go on in the half that remains). False, with the
        lease dropped, if the name was taken over; True otherwise (nothing held, nothing due, or renewed)."""
        lease = self._held.get(name)
        if lease is None or lease.renewing or self.clock() < lease.started + lease.seconds / 2:
            return True
        lease.renewing = True
        try:
            if await put(lease):
                return True
        finally:
            lease.renewing = False
        self.drop(name, lease)
        return False

    def drop(self, name: str, lease: Lease) -> bool:
        """Forget ``lease`` (released, or lost to another writer); whether it was still running, so that no other
        writer can have taken the name over and its holder may remove its claim."""
        if self._held.get(name) is lease:
            del self._held[name]
        return self.clock() < lease.expires_at
