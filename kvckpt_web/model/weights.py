"""Model weights on the device, in the layout the kernels of ``shaders/model/quant.wgsl`` read.

A quantized matrix (GGUF Q4_1 or Q8_0) stays quantized: its blocks are split at load time into a texture of
per-block scales and a texture of the 4- or 8-bit weights (see the header of ``quant.wgsl``), which makes the
20- and 34-byte GGUF blocks 4-byte aligned and lets kernels fetch them as texels. F32 tensors (the norms)
go into storage buffers. :func:`check_finite` refuses a tensor holding a NaN or an infinity before any upload.
Pure Python (struct, memoryview slicing): it runs in Pyodide too.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass
from math import isfinite, prod

from ..errors import FormatError, TensorError
from ..gpu.device import Buffer, Device, Texture, Usage

#: GGML type ids (the GGUF tensor info's type field).
F32 = 0
Q4_1 = 3
Q8_0 = 8

BLOCK = 32
"""Weights per quantized block."""

#: Bytes per GGUF block, and quant texels (16 bytes each) per block in the device layout.
BLOCK_BYTES = {Q4_1: 20, Q8_0: 34}
QUANT_TEXELS = {Q4_1: 1, Q8_0: 2}

F16_HIGH_BYTES = {Q4_1: {"scale": 1, "min": 3}, Q8_0: {"scale": 1}}
"""Offset in a GGUF block of the high byte of each of its float16 fields."""

_F16_NONFINITE = bytes(int(b & 0x7C == 0x7C) for b in range(256))
"""Per high byte of a little-endian float16: 1 where its exponent bits are all ones (an infinity or a NaN)."""

DENSE_MIN_BYTES = 65536
"""Smallest buffer of an F32 tensor: a 64 KiB uniform window of it can be bound."""

MAX_TEXTURE_WIDTH = 4096
"""Widest texture a tensor is laid out in (a power of two; rows of texels wrap at the width)."""


@dataclass(frozen=True)
class QuantizedTensor:
    """A Q4_1 or Q8_0 matrix of ``rows`` x ``blocks * 32`` on the device: texel ``r * blocks + b`` of ``scales``
    and texel(s) of ``quants`` hold block ``b`` of row ``r``."""

    name: str
    ggml_type: int
    rows: int
    blocks: int
    scales: Texture
    quants: Texture

    @property
    def cols(self) -> int:
        return self.blocks * BLOCK

    @property
    def scale_shift(self) -> int:
        """log2 of the scales texture's width."""
        return self.scales.width.bit_length() - 1

    @property
    def quant_shift(self) -> int:
        """log2 of the quants texture's width."""
        return self.quants.width.bit_length() - 1


@dataclass(frozen=True)
class DenseTensor:
    """An f32 tensor of GGUF ``shape`` (ne0 first) in a storage buffer that may also be bound as a uniform one
    (at least :data:`DENSE_MIN_BYTES`)."""

    name: str
    shape: tuple[int, ...]
    buffer: Buffer


DeviceTensor = QuantizedTensor | DenseTensor


def check_finite(name: str, ggml_type: int, data: memoryview | bytes) -> None:
    """FormatError naming tensor ``name`` (GGML type F32, Q4_1 or Q8_0, raw GGUF bytes ``data``) if it holds an
    infinity or a NaN: an F32 value, or a float16 scale or min of a block (the weights in a block are integers).

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
    size = BLOCK_BYTES[ggml_type]
    for field, offset in F16_HIGH_BYTES[ggml_type].items():
        block = view[offset::size].tobytes().translate(_F16_NONFINITE).find(1)
        if block >= 0:
            raise FormatError(f"tensors[{name!r}]", f"a finite float16 {field} in every block",
                              f"an infinity or NaN in block {block}")


def upload_tensor(device: Device, name: str, ggml_type: int, shape: tuple[int, ...] | list[int],
                  data: memoryview | bytes) -> DeviceTensor:
    """Put tensor ``name`` (GGML type ``ggml_type``, GGUF ``shape`` ne0 first, raw GGUF bytes ``data``) on
    ``device``: a :class:`QuantizedTensor` for Q4_1 / Q8_0 matrices, a :class:`DenseTensor` for F32.

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
    return _quantized(device, name, ggml_type, blocks, rows, [split_blocks(ggml_type, view, rows * blocks)])


def upload_stacked(device: Device, name: str,
                   parts: list[tuple[int, tuple[int, ...] | list[int], memoryview | bytes]]) -> QuantizedTensor:
    """Quantized matrices of one type and width, given as ``upload_tensor`` takes them (type, shape, data), on
    ``device`` as one matrix: their rows one after the other (q, k and v: one product instead of three)."""
    types = {ggml_type for ggml_type, _, _ in parts}
    if len(types) != 1:
        raise TensorError(f"{name}: ggml types of the parts", "one type", sorted(types))
    ggml_type = types.pop()
    blocks, rows, splits = 0, 0, []
    for i, (_, shape, data) in enumerate(parts):
        view = memoryview(data).cast("B")
        part_blocks, part_rows = _matrix(f"{name}[{i}]", ggml_type, tuple(int(n) for n in shape), len(view))
        if i and part_blocks != blocks:
            raise TensorError(f"{name}[{i}]: columns", blocks * BLOCK, part_blocks * BLOCK)
        blocks, rows = part_blocks, rows + part_rows
        splits.append(split_blocks(ggml_type, view, part_rows * part_blocks))
    return _quantized(device, name, ggml_type, blocks, rows, splits)


def _matrix(name: str, ggml_type: int, shape: tuple[int, ...], size: int) -> tuple[int, int]:
    """(blocks per row, rows) of a quantized matrix; TensorError for another type, shape or size."""
    if ggml_type not in BLOCK_BYTES:
        raise TensorError(f"{name}: ggml type", f"one of F32 ({F32}), Q4_1 ({Q4_1}), Q8_0 ({Q8_0})", ggml_type)
    if len(shape) != 2 or shape[0] % BLOCK:
        raise TensorError(f"{name}: shape", "(ne0, ne1) with ne0 a multiple of 32", shape)
    blocks, rows = shape[0] // BLOCK, shape[1]
    _check_size(name, size, rows * blocks * BLOCK_BYTES[ggml_type])
    return blocks, rows


def _quantized(device: Device, name: str, ggml_type: int, blocks: int, rows: int,
               splits: list[tuple[bytes | array, array]]) -> QuantizedTensor:
    """The tensor whose blocks ``splits`` holds (scales, quants of consecutive rows), on ``device``."""
    count = rows * blocks
    scales = bytearray().join(scale for scale, _ in splits)
    quants = bytearray().join(quant for _, quant in splits)
    return QuantizedTensor(name, ggml_type, rows, blocks,
                           _texture(device, f"{name}.scales", 1, count, scales),
                           _texture(device, f"{name}.quants", 4, count * QUANT_TEXELS[ggml_type], quants))


def destroy_tensor(device: Device, tensor: DeviceTensor) -> None:
    """Release the device memory of ``tensor`` (its textures or its buffer)."""
    for resource in (tensor.scales, tensor.quants) if isinstance(tensor, QuantizedTensor) else (tensor.buffer,):
        device.destroy(resource)


def split_blocks(ggml_type: int, view: memoryview, count: int) -> tuple[bytes | array, array]:
    """The scales texels (4 bytes a block) and quant texels (16 or 32 bytes a block) of ``count`` GGUF blocks.

    Copies whole words: a Q4_1 block is 5 u32 (the scales word, then 4 words of nibbles), a Q8_0 block 17 u16
    (the scale, then 16 of int8 pairs); each column of words is gathered by a strided slice and scattered by a
    strided assignment (twice as fast as byte by byte: 0.8 s for this model here).
    """
    if ggml_type == Q4_1:
        words = view.cast("I")
        quants = array("I", bytes(16 * count))
        for j in range(4):
            quants[j::4] = array("I", words[1 + j::5].tobytes())
        return words[0::5].tobytes(), quants
    halves = view.cast("H")
    scales = array("H", bytes(4 * count))  # the scale in the low half of a texel, 0 in the high half
    scales[0::2] = array("H", halves[0::17].tobytes())
    quants = array("H", bytes(32 * count))
    for j in range(16):
        quants[j::16] = array("H", halves[1 + j::17].tobytes())
    return scales, quants


def _texture(device: Device, label: str, channels: int, texels: int, data: bytearray) -> Texture:
    """A texture of ``texels`` texels holding ``data``, rows of a power-of-two width, the last row zero-padded."""
    width = min(MAX_TEXTURE_WIDTH, 1 << max(0, texels - 1).bit_length())
    height = -(-texels // width)
    data += bytes((width * height - texels) * channels * 4)
    texture = device.create_texture(width, height, channels, label)
    device.write_texture(texture, data)
    return texture


def _check_size(name: str, got: int, expected: int) -> None:
    if got != expected:
        raise TensorError(f"{name}: data bytes", expected, got)
