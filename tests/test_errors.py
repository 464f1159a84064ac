"""The exception hierarchy: whose fault an error is decides its branch (a caller's bad value, or damaged data)."""

from __future__ import annotations

import pytest

from kvckpt_web.errors import (BadValueError, ContextFullError, CorruptionError, DataError, FieldError, FormatError,
                               KVCkptError, LayoutHashMismatch, MetadataError, TensorError)


@pytest.mark.parametrize("cls", [FormatError, MetadataError, LayoutHashMismatch, CorruptionError])
def test_damaged_or_ill_formed_data_is_a_data_error_and_no_field_error(cls):
    assert issubclass(cls, DataError) and issubclass(cls, KVCkptError) and not issubclass(cls, FieldError)


@pytest.mark.parametrize("cls", [FieldError, ContextFullError, TensorError])
def test_a_callers_bad_value_is_a_field_error_and_no_data_error(cls):
    assert issubclass(cls, FieldError) and not issubclass(cls, DataError)


@pytest.mark.parametrize("cls", [FieldError, FormatError, MetadataError])
def test_a_bad_value_of_either_branch_names_the_field_the_expected_and_the_got(cls):
    error = cls("body.generation", "an integer >= 1", 0)
    assert isinstance(error, BadValueError) and (error.field, error.expected, error.got) == ("body.generation",
                                                                                             "an integer >= 1", 0)
    assert str(error) == "body.generation: expected an integer >= 1, got 0"
