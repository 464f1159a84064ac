"""Tensors at the API boundary: device arrays (TVM's Tensor arguments) and host byte tensors."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

from ..checks import check_buffer, check_each, check_instance, check_int
from ..errors import TensorError
from .device import Buffer


def _check_shape(field: str, shape: Any) -> tuple[int, ...]:
    return tuple(check_each(field, shape, "a tuple of dimensions",
                            lambda item, dim: check_int(item, dim, 0, error=TensorError)))


@dataclass(frozen=True)
class DeviceArray:
    """A typed, shaped view of a device buffer (what TVM passes as a Tensor)."""

    buffer: Buffer
    shape: tuple[int, ...]
    dtype: str
    offset: int = 0

    def __post_init__(self) -> None:
        check_instance("buffer", self.buffer, Buffer, "a device Buffer")
        object.__setattr__(self, "shape", _check_shape("shape", self.shape))
        check_instance("dtype", self.dtype, str, "a dtype name")
        check_int("offset", self.offset, 0, error=TensorError)


def as_bytes(data: Any, field: str, dtype: str, nbytes: int) -> memoryview:
    """``data`` (bytes-like or numpy array) as a flat byte view of exactly ``nbytes``; TensorError otherwise."""
    got_dtype = getattr(data, "dtype", None)
    if got_dtype is not None and str(got_dtype) != dtype:
        raise TensorError(f"{field}.dtype", dtype, str(got_dtype))
    view = check_buffer(field, data, error=TensorError)
    if not view.c_contiguous:
        raise TensorError(field, "a C-contiguous buffer", "a strided view")
    view = view.cast("B")
    if len(view) != nbytes:
        raise TensorError(f"{field}.nbytes", nbytes, len(view))
    return view


def span_bytes(count: int, size: int, stride: int) -> int:
    """Bytes from the start of the first of ``count`` blocks of ``size`` bytes, ``stride`` apart, to the end of
    the last (0 for no blocks)."""
    return (count - 1) * stride + size if count else 0


def zeroed(nbytes: int) -> memoryview:
    """A new writable host buffer of ``nbytes`` zero bytes.

    On desktop an anonymous memory map: the OS hands out zero pages as they are first written, where a
    bytearray would first write every byte itself (for 256 MiB here, ~250 ms of page faults up front,
    before a restore can start reading). In the browser a bytearray.
    """
    if nbytes == 0 or sys.platform == "emscripten":
        return memoryview(bytearray(nbytes))
    import mmap

    private = getattr(mmap, "MAP_PRIVATE", None)  # POSIX; Windows maps anonymous memory privately anyway
    mapped = mmap.mmap(-1, nbytes) if private is None else mmap.mmap(-1, nbytes, flags=private | mmap.MAP_ANONYMOUS)
    return memoryview(mapped)


@dataclass(frozen=True)
class HostTensor:
    """Little-endian bytes with a shape and dtype; ``numpy()`` views them as an array."""

    data: bytes
    shape: tuple[int, ...]
    dtype: str

    def __post_init__(self) -> None:
        check_buffer("data", self.data, error=TensorError)
        object.__setattr__(self, "shape", _check_shape("shape", self.shape))
        check_instance("dtype", self.dtype, str, "a dtype name")

    def numpy(self) -> Any:
        """A read-only numpy view (desktop only; bfloat16 needs the ``ml_dtypes`` package)."""
        import numpy as np

        dtype: Any = self.dtype
        if dtype == "bfloat16":
            try:
                import ml_dtypes
            except ImportError:
                raise TensorError("dtype", "a dtype numpy knows (bfloat16 needs `pip install ml_dtypes`)",
                                  "bfloat16") from None
            dtype = ml_dtypes.bfloat16
        return np.frombuffer(self.data, dtype=dtype).reshape(self.shape)
