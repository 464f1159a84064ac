"""The device interface on the desktop backend: copy runs, reads and upload staging."""

from __future__ import annotations

import asyncio
import os

import numpy as np
import pytest

from kvckpt_web import DeviceError
from kvckpt_web.backends import wgpu_native
from kvckpt_web.device import Copy, CopyRuns, Usage


def _buffers(device, size):
    src = device.create_buffer(size, Usage.COPY_SRC | Usage.COPY_DST, "test.src")
    dst = device.create_buffer(size, Usage.MAP_READ | Usage.COPY_DST, "test.dst")
    return src, dst


def test_copy_runs_copies_every_run_and_nothing_else(device):
    src, dst = _buffers(device, 64)
    try:
        device.write(src, 0, bytes(range(64)))
        device.submit([CopyRuns(src, dst, ((0, 32, 8), (40, 0, 12), (16, 48, 4)))])
        got = bytes(asyncio.run(_read(device, dst, 0, 64)))
        expected = bytearray(64)
        expected[32:40], expected[0:12], expected[48:52] = bytes(range(8)), bytes(range(40, 52)), bytes(range(16, 20))
        assert got == bytes(expected)
    finally:
        device.destroy(src)
        device.destroy(dst)


async def _read(device, buffer, offset, size, out=None):
    return await device.read(buffer, offset, size, out)


def test_read_fills_the_given_buffer_at_an_unaligned_offset(device):
    src, dst = _buffers(device, 64)
    try:
        device.write(src, 0, bytes(range(64)))
        device.submit([CopyRuns(src, dst, ((0, 0, 64),))])
        out = memoryview(bytearray(10))
        got = asyncio.run(_read(device, dst, 13, 10, out))
        assert bytes(out) == bytes(range(13, 23)) and bytes(got) == bytes(out)
    finally:
        device.destroy(src)
        device.destroy(dst)


def _at_page_offset(buffer: bytearray, offset: int, size: int) -> np.ndarray:
    """``size`` bytes of ``buffer`` starting ``offset`` bytes into one of its 4 KiB pages."""
    whole = np.frombuffer(buffer, np.uint8)
    start = (offset - whole.ctypes.data) % 4096
    return whole[start:start + size]


@pytest.mark.parametrize("trail", [16, 4000], ids=["destination-16-bytes-past-source", "far-apart"])
def test_host_copy_copies_every_byte_whatever_the_page_offsets(monkeypatch, trail):
    monkeypatch.setattr(wgpu_native, "ALIASED_PIECE_BYTES", 4096)  # several pieces and a remainder
    size = 3 * 4096 + 123
    src = _at_page_offset(bytearray(os.urandom(size + 8192)), 0, size)
    dst = _at_page_offset(bytearray(size + 8192), trail, size)
    wgpu_native.host_copy(dst, src)
    assert dst.tobytes() == src.tobytes()


def test_read_of_zero_bytes_is_done_at_once(device):
    src, dst = _buffers(device, 16)

    async def read_nothing():
        future = device.read(dst, 0, 0)
        assert future.done()
        return await future

    try:
        assert bytes(asyncio.run(read_nothing())) == b""
    finally:
        device.destroy(src)
        device.destroy(dst)


def _staging(device, size):
    return device.create_buffer(size, Usage.MAP_WRITE | Usage.COPY_SRC, "test.staging")


def test_several_submits_may_read_what_one_upload_wrote(device):
    staging = _staging(device, 64)
    src, dst = _buffers(device, 64)
    try:
        asyncio.run(device.upload(staging, 0, [bytes(range(64))]))
        device.submit([Copy(staging, 0, dst, 0, 32)])
        device.submit([Copy(staging, 32, dst, 32, 32)])  # the same staging again, before another upload
        assert bytes(asyncio.run(_read(device, dst, 0, 64))) == bytes(range(64))
        asyncio.run(device.upload(staging, 0, [bytes(64)]))  # and it takes the next upload
        device.submit([Copy(staging, 0, dst, 0, 64)])
        assert bytes(asyncio.run(_read(device, dst, 0, 64))) == bytes(64)
    finally:
        for buffer in (staging, src, dst):
            device.destroy(buffer)


def test_reading_staging_that_is_mapped_for_its_next_upload_is_refused_and_harmless(device):
    staging = _staging(device, 64)
    src, dst = _buffers(device, 64)
    spare, other = _buffers(device, 64)
    try:
        asyncio.run(device.upload(staging, 0, [bytes(range(64))]))
        device.submit([Copy(staging, 0, dst, 0, 64)])
        device.submit([Copy(src, 0, other, 0, 64)])  # another submit: the staging is mapped for its next upload
        with pytest.raises(DeviceError, match="test.staging"):
            device.submit([Copy(staging, 0, dst, 0, 64)])
        assert bytes(asyncio.run(_read(device, dst, 0, 64))) == bytes(range(64))
        asyncio.run(device.upload(staging, 0, [bytes(64)]))
        device.submit([Copy(staging, 0, dst, 0, 64)])
        assert bytes(asyncio.run(_read(device, dst, 0, 64))) == bytes(64)
    finally:
        for buffer in (staging, src, dst, spare, other):
            device.destroy(buffer)
