"""Helpers of the model kernel tests: put arrays on the device, run dispatches, read results back (from buffers and
from activation textures)."""

from __future__ import annotations

import asyncio

import numpy as np
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize

from kvckpt_web.gpu.device import Buffer, Copy, Device, Dispatch, Texture, TextureCopy, Usage
from kvckpt_web.model import kernels
from kvckpt_web.model.weights import (BF16, DEVICE_FORMS, F16, F16_HIGH_BYTES, Q4_0, Q4_1, Q4_K, Q5_0, Q5_K, Q6_K,
                                      Q8_0, QuantizedTensor, upload_tensor)

GGML = {t: GGMLQuantizationType(t) for t in DEVICE_FORMS}


def random_matrix(rng: np.random.Generator, ggml_type: int, rows: int, cols: int) -> tuple[np.ndarray, np.ndarray]:
    """A random quantized (rows, cols) matrix: its GGUF bytes and its dequantized float64 values."""
    raw = quantize(rng.standard_normal((rows, cols)).astype(np.float32), GGML[ggml_type])
    return raw, dequantize(raw, GGML[ggml_type]).astype(np.float64)


def random_blocks(rng: np.random.Generator, ggml_type: int, rows: int, cols: int,
                  wild: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """A (rows, cols) matrix of random valid blocks written from the type's byte layout (gguf cannot quantize to
    the K-quants): its GGUF bytes and ``gguf.quants.dequantize``'s float64 values. Every integer field is random
    bits; each float16 scale or min (F16: each value) is finite: with ``wild``, random bits (zeros, subnormals and
    the largest values included), else the float16 of N(0, 1) / 32. BF16 values: with ``wild`` random finite
    bits, else the bfloat16 of N(0, 1)."""
    form = DEVICE_FORMS[ggml_type]
    raw = rng.integers(0, 256, (rows, cols // form.weights * form.gguf_bytes), np.uint8)
    if ggml_type == BF16:
        halves = raw.view(np.uint16)
        if wild:
            halves[(halves >> 7 & 0xFF) == 0xFF] &= 0xBFFF  # an exponent of all ones (infinity, NaN) made finite
        else:
            halves[:] = rng.standard_normal(halves.shape).astype(np.float32).view(np.uint32) >> 16
    else:
        size = 2 if ggml_type == F16 else form.gguf_bytes
        blocks = raw.reshape(-1, size)
        for high in F16_HIGH_BYTES[ggml_type].values():
            field = blocks[:, high - 1:high + 1].copy().view(np.uint16)
            if wild:
                field[(field & 0x7C00) == 0x7C00] &= 0xBFFF
            else:
                field[:] = (rng.standard_normal(field.shape) / 32).astype(np.float16).view(np.uint16)
            blocks[:, high - 1:high + 1] = field.view(np.uint8)
    return raw, dequantize(raw, GGML[ggml_type]).astype(np.float64)


QUANT_BYTES = {Q4_0: (2, 18), Q4_1: (4, 20), Q5_0: (2, 22), Q8_0: (2, 34), Q4_K: (16, 144), Q5_K: (16, 176),
               Q6_K: (0, 192), F16: (0, 64), BF16: (0, 64)}
"""The byte range of the integers (the values, for F16 / BF16) in a block (32 values) of each type."""


def offsets(raw: np.ndarray, ggml_type: int) -> np.ndarray:
    """Per weight of GGUF blocks ``raw``, the float64 value its integer would give if 0: the part of the weight that
    does not scale with it (Q4_0's -8 d, Q4_1's m, a K-quant's -dmin * m; 0 for Q8_0, F16, BF16)."""
    form = DEVICE_FORMS[ggml_type]
    blocks = raw.reshape(-1, form.gguf_bytes).copy()
    start, end = QUANT_BYTES[ggml_type]
    blocks[:, start:end] = 0
    return dequantize(blocks.reshape(raw.shape), GGML[ggml_type]).astype(np.float64)


def upload_matrix(device: Device, raw: np.ndarray, ggml_type: int, name: str = "w") -> QuantizedTensor:
    form = DEVICE_FORMS[ggml_type]
    rows = raw.shape[0]
    cols = raw.shape[1] // form.gguf_bytes * form.weights
    return upload_tensor(device, name, ggml_type, (cols, rows), memoryview(raw.tobytes()))


def activations(device: Device, values: np.ndarray) -> Texture:
    """An activation texture holding ``values`` (tokens, features) as f32."""
    rows = np.atleast_2d(values).astype(np.float32)
    texture = kernels.activation_texture(device, rows.shape[1], rows.shape[0], "test.x")
    device.write_texture(texture, rows.tobytes())
    return texture


def rows(device: Device, values: np.ndarray) -> Buffer:
    """A storage buffer holding ``values`` as f32, row-major."""
    buffer = device.create_buffer(values.size * 4, Usage.STORAGE | Usage.COPY_DST | Usage.COPY_SRC, "test.rows")
    device.write(buffer, 0, values.astype(np.float32).tobytes())
    return buffer


def run(device: Device, dispatches: list[Dispatch], out: Buffer, size: int) -> bytes:
    """Submit ``dispatches`` and read ``size`` bytes of ``out`` back."""
    staging = device.create_buffer(size, Usage.MAP_READ | Usage.COPY_DST, "test.readback")
    try:
        device.submit([*dispatches, Copy(out, 0, staging, 0, size)])
        return bytes(asyncio.run(_read(device, staging, size)))
    finally:
        device.destroy(staging)


def run_texture(device: Device, dispatches: list[Dispatch], out: Texture) -> np.ndarray:
    """Submit ``dispatches`` and read activation texture ``out`` back: (rows, features) f32."""
    staging = device.create_buffer(out.row_pitch * out.height, Usage.MAP_READ | Usage.COPY_DST, "test.readback")
    try:
        device.submit([*dispatches, TextureCopy(out, staging)])
        data = np.frombuffer(bytes(asyncio.run(_read(device, staging, staging.size))), np.float32)
    finally:
        device.destroy(staging)
    return data.reshape(out.height, out.row_pitch // 4)[:, :4 * out.width]


async def _read(device: Device, buffer: Buffer, size: int) -> memoryview:
    return await device.read(buffer, 0, size)


def floats(data: bytes) -> np.ndarray:
    return np.frombuffer(data, np.float32).astype(np.float64)
