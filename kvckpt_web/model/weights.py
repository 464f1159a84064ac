"""Model weights on the device, in the layout the kernels of ``shaders/model/quant.wgsl`` read.

A matrix (GGUF Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q5_K, Q6_K, F16 or BF16) stays quantized: its GGUF bytes go up into a
storage buffer, and a kernel (``shaders/model/layout.wgsl``) lays them out in one read-only storage texture, in
tiles of 64 rows whose neighbouring rows sit in neighbouring texels, with per-block scale words of four rows in one
texel (see the header of ``layout.wgsl``): on a CPU adapter a step of a product then reads one stretch of memory
instead of 64, and nothing is rearranged on the host. Each type keeps its GGUF bits, some regrouped
(:data:`DEVICE_FORMS`); bits per weight on the device (GGUF's in brackets): Q4_0 5 (4.5), Q4_1 5 (5), Q5_0 6
(5.5), Q8_0 9 (8.5), Q4_K 4.5 (4.5), Q5_K 5.5 (5.5), Q6_K 6.625 (6.5625), F16 and BF16 16 (16); the kernels
dequantize as they read, and no matrix is expanded to f32. F32 tensors (the norms) go into storage buffers.
:func:`check_finite` refuses a tensor holding a NaN or an infinity before any upload. Pure Python: it runs in
Pyodide too.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from math import isfinite, prod

from ..errors import FormatError, TensorError
from ..gpu.device import Buffer, Device, Dispatch, Texture, Usage
from ..gpu.wgsl import source

#: GGML type ids (the GGUF tensor info's type field).
F32 = 0
F16 = 1
Q4_0 = 2
Q4_1 = 3
Q5_0 = 6
Q8_0 = 8
Q4_K = 12
Q5_K = 13
Q6_K = 14
BF16 = 30

BLOCK = 32
"""Weights per block of the products (a K-quant's 256-weight block is 8 of them)."""


@dataclass(frozen=True)
class DeviceForm:
    """How a type's matrix lies on the device: per unit of ``weights`` weights of a row (a GGUF block, or 32 values
    of F16 / BF16) of ``gguf_bytes`` bytes in the file, ``texels`` data texels and ``words`` scale words
    (``layout.wgsl``)."""

    name: str
    weights: int
    gguf_bytes: int
    texels: int
    words: int


DEVICE_FORMS = {t: DeviceForm(name, *form) for t, name, form in (
    (Q4_0, "Q4_0", (32, 18, 1, 1)), (Q4_1, "Q4_1", (32, 20, 1, 1)), (Q5_0, "Q5_0", (32, 22, 1, 2)),
    (Q8_0, "Q8_0", (32, 34, 2, 1)), (Q4_K, "Q4_K", (256, 144, 9, 0)), (Q5_K, "Q5_K", (256, 176, 11, 0)),
    (Q6_K, "Q6_K", (256, 210, 13, 1)), (F16, "F16", (32, 64, 4, 0)), (BF16, "BF16", (32, 64, 4, 0)))}
"""The device form of each matrix type, by GGML type id."""



def _supported_types() -> str:
    names = {F32: "F32", **{t: f.name for t, f in DEVICE_FORMS.items()}}
    return ", ".join(f"{names[t]} ({t})" for t in sorted(names))


SUPPORTED_TYPES = _supported_types()
"""The ggml types a tensor may have, as refusals name them."""

TILE_ROWS = 64
"""Rows of a tile of the device layout (8 invocations of 8 rows: ``layout.wgsl``)."""

F16_HIGH_BYTES = {Q4_0: {"scale": 1}, Q4_1: {"scale": 1, "min": 3}, Q5_0: {"scale": 1}, Q8_0: {"scale": 1},
                  Q4_K: {"scale": 1, "min": 3}, Q5_K: {"scale": 1, "min": 3}, Q6_K: {"scale": 209},
                  F16: {"value": 1}}
"""Offset in a GGUF block (an F16 value: 2 bytes) of the high byte of each of its float16 fields."""

_F16_NONFINITE = bytes(int(b & 0x7C == 0x7C) for b in range(256))
"""Per high byte of a little-endian float16: 1 where its exponent bits are all ones (an infinity or a NaN)."""

_BF16_HIGH_ONES = bytes(int(b & 0x7F == 0x7F) for b in range(256))
"""Per high byte of a little-endian bfloat16: 1 where its 7 high exponent bits are all ones."""

DENSE_MIN_BYTES = 65536
"""Smallest buffer of an F32 tensor: a 64 KiB uniform window of it can be bound."""

MAX_TEXTURE_WIDTH = 4096
"""Widest texture a tensor is laid out in (a power of two; rows of texels wrap at the width)."""


@dataclass(frozen=True)
class QuantizedTensor:
    """A matrix of ``rows`` x ``blocks * 32`` of one of the :data:`DEVICE_FORMS` types on the device, in ``texels``
    as ``layout.wgsl`` lays it out."""

    name: str
    ggml_type: int
    rows: int
    blocks: int
    texels: Texture

    @property
    def cols(self) -> int:
        return self.blocks * BLOCK

    @property
    def shift(self) -> int:
        """log2 of the texture's width."""
        return self.texels.width.bit_length() - 1

    @property
    def scale_base(self) -> int:
        """The texel where the scales start, after the weights of every tile."""
        return layout_texels(self.ggml_type, self.rows, self.blocks)[0]

    @property
    def units(self) -> int:
        """Units (``DeviceForm``) per row."""
        return self.cols // DEVICE_FORMS[self.ggml_type].weights


def layout_texels(ggml_type: int, rows: int, blocks: int) -> tuple[int, int]:
    """(texel where the scales start, texels in all) of a matrix of ``blocks`` 32-weight blocks a row in the device
    layout."""
    form = DEVICE_FORMS[ggml_type]
    padded = -(-rows // TILE_ROWS) * TILE_ROWS
    units = blocks * BLOCK // form.weights
    scale_base = padded * units * form.texels
    return scale_base, scale_base + padded // 4 * units * form.words


@dataclass(frozen=True)
class DenseTensor:
    """An f32 tensor of GGUF ``shape`` (ne0 first) in a storage buffer that may also be bound as a uniform one
    (at least :data:`DENSE_MIN_BYTES`)."""

    name: str
    shape: tuple[int, ...]
    buffer: Buffer


DeviceTensor = QuantizedTensor | DenseTensor


def check_finite(name: str, ggml_type: int, data: memoryview | bytes) -> None:
    """FormatError naming tensor ``name`` (GGML type F32 or one of :data:`DEVICE_FORMS`, raw GGUF bytes ``data``)
    if it holds an infinity or a NaN: an F32, F16 or BF16 value, or a float16 scale or min of a block (the weights
    in a block are integers).

    Pure Python at C speed, for Pyodide too: the float16 fields are found by the high bytes of their exponents
    (a strided slice of the blocks mapped by ``bytes.translate``, then searched); an F32 tensor's values are
    summed as doubles, which no run of finite float32 values overflows.
    """
    view = memoryview(data).cast("B")
    if ggml_type == F32:
        values = view.cast("f")
        if not isfinite(sum(values)):
            i = next(i for i, value in enumerate(values) if not isfinite(value))
            raise FormatError(f"tensors[{name!r}]", "finite values", f"{values[i]} at element {i}")
        return
    if ggml_type == BF16:
        _check_bf16(name, view)
        return
    size = 2 if ggml_type == F16 else DEVICE_FORMS[ggml_type].gguf_bytes
    for field, offset in F16_HIGH_BYTES[ggml_type].items():
        block = view[offset::size].tobytes().translate(_F16_NONFINITE).find(1)
        if block >= 0:
            raise FormatError(f"tensors[{name!r}]", f"a finite float16 {field} in every block",
                              f"an infinity or NaN in block {block}")


def _check_bf16(name: str, view: memoryview) -> None:
    """check_finite of BF16 values: a high byte whose 7 exponent bits are all ones starts a candidate, an infinity
    or a NaN where the top bit of its low byte is set too."""
    high = view[1::2].tobytes().translate(_BF16_HIGH_ONES)
    i = high.find(1)
    while i >= 0:
        if view[2 * i] & 0x80:
            raise FormatError(f"tensors[{name!r}]", "finite values", f"an infinity or NaN at element {i}")
        i = high.find(1, i + 1)


def upload_tensor(device: Device, name: str, ggml_type: int, shape: tuple[int, ...] | list[int],
                  data: memoryview | bytes) -> DeviceTensor:
    """Put tensor ``name`` (GGML type ``ggml_type``, GGUF ``shape`` ne0 first, raw GGUF bytes ``data``) on
    ``device``: a :class:`QuantizedTensor` for a matrix of a :data:`DEVICE_FORMS` type, a :class:`DenseTensor` for
    F32.

    TensorError for another type, a shape whose rows are not whole blocks, or data of the wrong size.
    """
    shape = tuple(int(n) for n in shape)
    view = memoryview(data).cast("B")
    if ggml_type == F32:
        _check_size(name, len(view), 4 * prod(shape))
        # products that fold in an RMSNorm bind its weight as a uniform window of DENSE_MIN_BYTES
        buffer = device.create_buffer(max(len(view), DENSE_MIN_BYTES), Usage.STORAGE | Usage.UNIFORM | Usage.COPY_DST,
                                      name)
        device.write(buffer, 0, view)
        return DenseTensor(name, shape, buffer)
    blocks, rows = _matrix(name, ggml_type, shape, len(view))
    return _quantized(device, name, ggml_type, blocks, rows, view)


def upload_stacked(device: Device, name: str,
                   parts: list[tuple[int, tuple[int, ...] | list[int], memoryview | bytes]]) -> QuantizedTensor:
    """Quantized matrices of one type and width, given as ``upload_tensor`` takes them (type, shape, data), on
    ``device`` as one matrix: their rows one after the other (q, k and v: one product instead of three)."""
    types = {ggml_type for ggml_type, _, _ in parts}
    if len(types) != 1:
        raise TensorError(f"{name}: ggml types of the parts", "one type", sorted(types))
    ggml_type = types.pop()
    blocks, rows, views = 0, 0, []
    for i, (_, shape, data) in enumerate(parts):
        view = memoryview(data).cast("B")
        part_blocks, part_rows = _matrix(f"{name}[{i}]", ggml_type, tuple(int(n) for n in shape), len(view))
        if i and part_blocks != blocks:
            raise TensorError(f"{name}[{i}]: columns", blocks * BLOCK, part_blocks * BLOCK)
        blocks, rows = part_blocks, rows + part_rows
        views.append(view)
    return _quantized(device, name, ggml_type, blocks, rows, b"".join(views))


def _matrix(name: str, ggml_type: int, shape: tuple[int, ...], size: int) -> tuple[int, int]:
    """(blocks per row, rows) of a quantized matrix; TensorError for another type, shape or size."""
    form = DEVICE_FORMS.get(ggml_type)
    if form is None:
        raise TensorError(f"{name}: ggml type", f"one of {SUPPORTED_TYPES}", ggml_type)
    if len(shape) != 2 or shape[0] % form.weights:
        raise TensorError(f"{name}: shape", f"(ne0, ne1) with ne0 a multiple of {form.weights} ({form.name})", shape)
    rows = shape[1]
    _check_size(name, size, rows * shape[0] // form.weights * form.gguf_bytes)
    return shape[0] // BLOCK, rows


def _quantized(device: Device, name: str, ggml_type: int, blocks: int, rows: int,
               raw: bytes | memoryview) -> QuantizedTensor:
    """The matrix whose GGUF blocks ``raw`` holds (whole rows, in order) on ``device``, laid out by the layout
    kernel (queued: later submits see it); uploaded in pieces of whole tiles that a storage binding can hold."""
    scale_base, texels = layout_texels(ggml_type, rows, blocks)
    width = min(MAX_TEXTURE_WIDTH, 1 << max(0, texels - 1).bit_length())
    tensor = QuantizedTensor(name, ggml_type, rows, blocks, device.create_texture(width, -(-texels // width), 4, name))
    form = DEVICE_FORMS[ggml_type]
    units = blocks * BLOCK // form.weights
    row_bytes = units * form.gguf_bytes
    piece_rows = max(1, device.info.max_storage_binding // (row_bytes * TILE_ROWS)) * TILE_ROWS
    kernel = device.kernel("model.layout", source("model", "layout"), "tile")
    for first in range(0, rows, piece_rows):
        count = min(piece_rows, rows - first)
        piece = memoryview(raw)[first * row_bytes:(first + count) * row_bytes]
        staging = device.create_buffer(len(piece), Usage.STORAGE | Usage.COPY_DST, f"{name}.gguf")
        device.write(staging, 0, piece if len(piece) % 4 == 0 else bytes(piece) + bytes(-len(piece) % 4))
        params = struct.pack("<8I", rows, units, tensor.shift, scale_base, texels, ggml_type, first, count)
        device.submit([Dispatch(kernel, params, (staging, tensor.texels), texels)])
        device.destroy(staging)
    return tensor


def destroy_tensor(device: Device, tensor: DeviceTensor) -> None:
    """Release the device memory of ``tensor`` (its texture or its buffer)."""
    device.destroy(tensor.texels if isinstance(tensor, QuantizedTensor) else tensor.buffer)


def _check_size(name: str, got: int, expected: int) -> None:
    if got != expected:
        raise TensorError(f"{name}: data bytes", expected, got)
