"""The one exception hierarchy of kvckpt_web.

Every error the library raises on purpose derives from :class:`KVCkptError`.
Errors about a value (:class:`BadValueError`) carry the field it came from, what
was expected and what was got, and say all three in their message. Whose fault
an error is decides its branch (and the HTTP API's status, ``server/api_errors.py``):

* :class:`FieldError` -- a value the caller gave (an argument, a request's field,
  a flag) is wrong: the caller's fault (HTTP 400). :class:`ContextFullError` and
  :class:`TensorError` (a tensor argument) are FieldErrors.
* :class:`DataError` -- data read from a store, a file or an export (a checkpoint's
  manifest or metadata, a record, a model file) is damaged or off its format: no
  fault of the caller, who can do nothing about it (HTTP 500).
  :class:`FormatError` and :class:`MetadataError` (:class:`LayoutHashMismatch`)
  name the field; :class:`CorruptionError` (a checksum, a missing chunk) does not.
* the others: a state (:class:`CheckpointStateError`, :class:`SequenceError`,
  :class:`CapacityError`, :class:`ConflictError`, :class:`NotFoundError`) or a
  failure of what the library stands on (:class:`StoreError`, :class:`DeviceError`).

A check that serves both, a name's, runs on the caller's values and raises
FieldError; a reader applying it to stored bytes reports a FormatError instead.
"""

from __future__ import annotations

from typing import Any

_MISSING = object()


def is_int(value: Any, low: int | None = None, high: int | None = None) -> bool:
    """Whether ``value`` is an integer (a bool is not) within ``low..high`` (either bound optional, inclusive)."""
    return (isinstance(value, int) and not isinstance(value, bool)
            and (low is None or value >= low) and (high is None or value <= high))


class KVCkptError(Exception):
    """Base class of every error raised by kvckpt_web."""


class BadValueError(KVCkptError):
    """A value does not match what it must be: a :class:`FieldError` (the caller's) or a :class:`FormatError` /
    :class:`MetadataError` (stored or loaded data's).

    ``field`` names where the value came from (``"metadata.groups[3].nbytes"``),
    ``expected`` and ``got`` are the two values; the message says all three.
    """

    def __init__(self, field: str, expected: Any, got: Any = _MISSING, detail: str = "") -> None:
        self.field = field
        self.expected = expected
        self.got = None if got is _MISSING else got
        message = f"{field}: expected {expected}"
        if got is not _MISSING:
            message += f", got {got!r}" if isinstance(got, str) else f", got {got}"
        if detail:
            message += f" ({detail})"
        super().__init__(message)


class FieldError(BadValueError):
    """A value the caller gave (an argument, a request's field, a flag, a setting) is not what it must be."""


class DataError(KVCkptError):
    """Data read from a store, a file or an export is damaged or does not follow its format: not the caller's
    fault (see the module docstring)."""


class UnsupportedLayoutError(KVCkptError):
    """The cache layout cannot be checkpointed (same reasons as TVM)."""


class MetadataError(DataError, BadValueError):
    """Checkpoint metadata (stored, or in a TVM export) is malformed or does not fit this cache."""


class LayoutHashMismatch(MetadataError):
    """The checkpoint was written by a cache of another layout."""


class CheckpointStateError(KVCkptError):
    """A checkpoint primitive was called in the wrong state (import not prepared, group twice, ...)."""


class SequenceError(KVCkptError):
    """A sequence id is unknown, taken, or cannot be used for this operation."""


class CapacityError(KVCkptError):
    """The cache has not enough free pages or sequence slots."""


class TensorError(FieldError):
    """A page group or K/V tensor the caller gave has the wrong shape, dtype or size (or a tensor argument, a layer
    or page index, is out of range)."""


class DeviceError(KVCkptError):
    """The WebGPU device is missing, lost, or refused an operation."""


class FormatError(DataError, BadValueError):
    """A stored file or container does not follow its format specification."""


class CorruptionError(DataError):
    """Stored bytes fail their checksum or are missing: the data is damaged."""


class StoreError(KVCkptError):
    """A store could not read, write or lock."""


class NotFoundError(KVCkptError):
    """A store holds no checkpoint of the requested name or generation."""


class ContextFullError(FieldError):
    """A prompt leaves no room in the context for a reply; the message names the limit and the token counts."""


class ConflictError(KVCkptError):
    """Another writer or another conversation holds what this call would write (a checkpoint name). ``retry_at``:
    when (Unix time, seconds) a claim held as a lease may be taken over if its holder does not renew it; None if
    no such time is known."""

    def __init__(self, message: str, *, retry_at: float | None = None) -> None:
        self.retry_at = retry_at
        super().__init__(message)


class UnusableCheckpointError(KVCkptError):
    """A checkpoint's K/V cannot be used here; ``reason`` says why ("model", "layout", "corrupt", "length")."""

    def __init__(self, reason: str, message: str) -> None:
        self.reason = reason
        super().__init__(message)


class ModelUnavailableError(KVCkptError):
    """A model cannot be loaded or run in this build or installation."""
