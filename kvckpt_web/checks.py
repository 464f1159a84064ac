"""Argument checks every layer shares.

Each check returns the value it was given (or the list it iterated) when it fits, and otherwise raises a
:class:`~kvckpt_web.errors.FieldError` (or the subclass asked for) naming the argument, what it must be and
what it is: the value if it is of the right type, else the name of its type. Public functions run them
before they change anything.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from .errors import FieldError, is_int

__all__ = ["check_bool", "check_buffer", "check_callable", "check_collection", "check_each", "check_instance",
           "check_int", "check_items", "check_path", "check_seconds", "check_writable", "type_name"]

_T = TypeVar("_T")


def type_name(value: Any) -> str:
    """What a message says a value of the wrong type is: its type's name."""
    return type(value).__name__


def check_int(field: str, value: Any, low: int | None = None, high: int | None = None, *,
              error: type[FieldError] = FieldError) -> int:
    """``value`` if it is an integer (not a bool) within ``low..high`` (each bound optional, inclusive)."""
    if is_int(value, low, high):
        return value
    if low is not None and high is not None:
        expected = f"an integer in [{low}, {high}]"
    else:
        expected = "an integer" + (f" >= {low}" if low is not None else f" <= {high}" if high is not None else "")
    raise error(field, expected, value if is_int(value) else type_name(value))


def check_seconds(field: str, value: Any) -> float:
    """``value`` as a float if it is a finite number of seconds >= 0 (a timeout: not nan, inf or negative)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise FieldError(field, "a finite number of seconds >= 0", type_name(value))
    if not (math.isfinite(value) and value >= 0):
        raise FieldError(field, "a finite number of seconds >= 0", value)
    return float(value)


def check_bool(field: str, value: Any) -> bool:
    """``value`` if it is True or False."""
    if not isinstance(value, bool):
        raise FieldError(field, "True or False", type_name(value))
    return value


def check_instance(field: str, value: Any, kind: type[_T] | tuple[type, ...], expected: str) -> _T:
    """``value`` if it is an instance of ``kind`` (``expected`` says what that is, for the message)."""
    if not isinstance(value, kind):
        raise FieldError(field, expected, type_name(value))
    return value


def check_path(field: str, value: Any) -> str:
    """``value`` as a str if it is a file system path (a str or an ``os.PathLike`` of one)."""
    path = os.fspath(value) if isinstance(value, (str, os.PathLike)) else None
    if not isinstance(path, str):
        raise FieldError(field, "a path (str or os.PathLike)", type_name(value))
    return path


def check_buffer(field: str, value: Any, *, error: type[FieldError] = FieldError) -> memoryview:
    """``value`` as a memoryview if it is bytes-like (bytes, bytearray, memoryview, a numpy array)."""
    try:
        return memoryview(value)
    except TypeError:
        raise error(field, "a bytes-like object or array", type_name(value)) from None


def check_writable(field: str, value: Any, *, error: type[FieldError] = FieldError) -> memoryview:
    """``value`` as a memoryview if it is a writable bytearray or memoryview (a buffer to read into)."""
    if not isinstance(value, (bytearray, memoryview)) or memoryview(value).readonly:
        raise error(field, "a writable bytearray or memoryview", type_name(value))
    return memoryview(value)


def check_callable(field: str, value: Any) -> Any:
    """``value`` if it is None or callable (an optional callback)."""
    if value is not None and not callable(value):
        raise FieldError(field, "a function or None", type_name(value))
    return value


def check_collection(field: str, value: Any, expected: str) -> Iterable[Any]:
    """``value`` if it is a collection to iterate: a bare str or bytes (one value, not a collection of them) and
    anything that cannot be iterated are refused (``expected`` says what the collection holds)."""
    if isinstance(value, (str, bytes, bytearray, memoryview)):
        raise FieldError(field, f"{expected} (a bare {type_name(value)} is one value, not a collection)",
                         type_name(value))
    if not isinstance(value, Iterable):
        raise FieldError(field, expected, type_name(value))
    return value


def check_items(field: str, value: Any, expected: str) -> list[Any]:
    """The items of the collection ``value`` (see :func:`check_collection`) as a list."""
    return list(check_collection(field, value, expected))


def check_each(field: str, value: Any, expected: str, check: Callable[[str, Any], _T]) -> list[_T]:
    """The items of the collection ``value`` (see :func:`check_items`), each passed through ``check(field, item)``
    with ``field[i]`` naming it."""
    return [check(f"{field}[{i}]", item) for i, item in enumerate(check_items(field, value, expected))]
