"""A realm's Runtime holds the caches JavaScript drives by handle (no browser needed: the caches are desktop ones),
and errors cross to JavaScript in one shape."""

from __future__ import annotations

import asyncio

import pytest

from kvckpt_web.errors import CheckpointStateError, FieldError
from kvckpt_web.web.runtime import Runtime, error_fields


def test_handles_count_up_from_one_and_a_closed_handle_is_never_given_again(make_cache):
    runtime = Runtime()
    first, second = runtime.add_cache(make_cache()), runtime.add_cache(make_cache())
    runtime.close_cache(first)
    assert (first, second, runtime.add_cache(make_cache())) == (1, 2, 3)


def test_a_closed_handle_raises_checkpoint_state_error_and_closing_again_does_nothing(make_cache):
    runtime = Runtime()
    cache = make_cache()
    handle = runtime.add_cache(cache)
    runtime.close_cache(handle)
    runtime.close_cache(handle)
    assert cache.closed
    with pytest.raises(CheckpointStateError, match="closed"):
        runtime.cache(handle)


def test_a_handle_never_given_raises_field_error_naming_the_open_ones(make_cache):
    runtime = Runtime()
    runtime.add_cache(make_cache())
    with pytest.raises(FieldError, match=r"cache: expected an open cache handle \[1\], got 7"):
        runtime.cache(7)


def test_two_runtimes_share_no_caches(make_cache):
    one, other = Runtime(), Runtime()
    cache = make_cache()
    handle = one.add_cache(cache)
    assert one.cache(handle) is cache
    with pytest.raises(FieldError, match="cache"):
        other.cache(handle)


def test_an_unknown_store_kind_is_refused_naming_the_kinds():
    with pytest.raises(FieldError, match="store: expected 'indexeddb' or 'opfs', got 's3'"):
        asyncio.run(Runtime().open_store("s3", "x"))


def test_an_exception_of_another_kind_crosses_to_javascript_with_its_class_and_message_only():
    exc = UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte")  # has a `reason` of its own
    assert error_fields(exc) == {"name": "UnicodeDecodeError", "message": str(exc)}
