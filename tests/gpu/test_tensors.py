"""Host tensors and the byte views the cache accepts."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from kvckpt_web import HostTensor, TensorError
from kvckpt_web.gpu.tensors import as_bytes, zeroed


def test_host_tensor_numpy_views_its_bytes_with_shape_and_dtype():
    values = np.arange(6, dtype=np.float16).reshape(1, 2, 3)
    array = HostTensor(values.tobytes(), (1, 2, 3), "float16").numpy()
    assert array.dtype == np.float16 and array.shape == (1, 2, 3)
    assert np.array_equal(array, values)


def test_host_tensor_numpy_reads_bfloat16_through_ml_dtypes():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    values = np.array([1.0, -2.5, 3.0], dtype=ml_dtypes.bfloat16)
    array = HostTensor(values.tobytes(), (3,), "bfloat16").numpy()
    assert array.dtype == ml_dtypes.bfloat16 and np.array_equal(array, values)


def test_host_tensor_numpy_of_bfloat16_without_ml_dtypes_names_the_package(monkeypatch):
    monkeypatch.setitem(sys.modules, "ml_dtypes", None)
    with pytest.raises(TensorError, match="ml_dtypes") as info:
        HostTensor(b"\0\0", (1,), "bfloat16").numpy()
    assert info.value.field == "dtype"


def test_as_bytes_rejects_an_array_of_another_dtype():
    with pytest.raises(TensorError) as info:
        as_bytes(np.zeros(4, np.float32), "k", "float16", 8)
    assert (info.value.field, info.value.expected, info.value.got) == ("k.dtype", "float16", "float32")


def test_as_bytes_rejects_a_strided_view():
    with pytest.raises(TensorError, match="C-contiguous"):
        as_bytes(np.zeros((4, 4), np.float16)[:, ::2], "k", "float16", 16)


def test_as_bytes_rejects_a_wrong_size():
    with pytest.raises(TensorError) as info:
        as_bytes(b"\0" * 6, "v", "float16", 8)
    assert (info.value.field, info.value.expected, info.value.got) == ("v.nbytes", 8, 6)


@pytest.mark.parametrize("nbytes", [0, 1, 5000, 3 << 20])
def test_zeroed_is_a_writable_buffer_of_that_many_zero_bytes(nbytes):
    buffer = zeroed(nbytes)
    assert len(buffer) == nbytes and not buffer.readonly and not any(buffer)
    if nbytes:
        buffer[nbytes - 1] = 7
        assert buffer[nbytes - 1] == 7
