"""Helpers of the model kernel tests: put arrays on the device, run dispatches, read results back (from buffers and
from activation textures)."""

from __future__ import annotations

import asyncio

import numpy as np
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize

from kvckpt_web.gpu.device import Buffer, Copy, Device, Dispatch, Texture, TextureCopy, Usage
from kvckpt_web.model import kernels
from kvckpt_web.model.weights import Q4_1, Q8_0, QuantizedTensor, upload_tensor

GGML = {Q4_1: GGMLQuantizationType.Q4_1, Q8_0: GGMLQuantizationType.Q8_0}


def random_matrix(rng: np.random.Generator, ggml_type: int, rows: int, cols: int) -> tuple[np.ndarray, np.ndarray]:
    """A random quantized (rows, cols) matrix: its GGUF bytes and its dequantized float64 values."""
    raw = quantize(rng.standard_normal((rows, cols)).astype(np.float32), GGML[ggml_type])
    return raw, dequantize(raw, GGML[ggml_type]).astype(np.float64)


def upload_matrix(device: Device, raw: np.ndarray, ggml_type: int, name: str = "w") -> QuantizedTensor:
    rows = raw.shape[0]
    cols = raw.shape[1] // {Q4_1: 20, Q8_0: 34}[ggml_type] * 32
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
