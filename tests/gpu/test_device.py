"""The device interface on the desktop backend: copy runs, reads and upload staging."""

from __future__ import annotations

import asyncio
import os

import numpy as np
import pytest

from kvckpt_web import DeviceError
from kvckpt_web.gpu import wgpu_native
from kvckpt_web.gpu.device import Copy, CopyRuns, Usage


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


# ----- storage buffers that map in place ------------------------------------------------------------------

IN_PLACE = Usage.STORAGE | Usage.COPY_SRC | Usage.COPY_DST | Usage.MAP_READ | Usage.MAP_WRITE


@pytest.fixture
def in_place(device):
    if not device.info.maps_storage:
        pytest.skip(f"{device.info.adapter!r}: storage buffers do not map in place")
    buffer = device.create_buffer(64, IN_PLACE, "test.in_place")
    yield buffer
    device.destroy(buffer)


def test_a_cpu_adapter_opens_with_storage_buffers_that_map_in_place(device):
    assert device.info.maps_storage == device.info.is_cpu


def test_host_copies_into_a_storage_buffer_are_what_the_device_reads(device, in_place):
    _, dst = _buffers(device, 64)
    try:
        device.copy_to_buffer(in_place, [(8, memoryview(bytes(range(1, 17)))), (44, memoryview(b"abcd"))])
        device.submit([Copy(in_place, 0, dst, 0, 64)])
        expected = bytearray(64)
        expected[8:24], expected[44:48] = bytes(range(1, 17)), b"abcd"
        assert bytes(asyncio.run(_read(device, dst, 0, 64))) == bytes(expected)
    finally:
        device.destroy(dst)


def test_host_copies_out_of_a_storage_buffer_see_the_work_submitted_before(device, in_place):
    src, _ = _buffers(device, 64)
    try:
        device.write(src, 0, bytes(range(64)))
        device.submit([Copy(src, 0, in_place, 0, 64)])
        device.write(in_place, 60, b"wxyz")  # a queue write no submit has carried yet
        first, second = memoryview(bytearray(6)), memoryview(bytearray(8))
        device.copy_from_buffer(in_place, [(2, first), (56, second)])
        assert (bytes(first), bytes(second)) == (bytes(range(2, 8)), bytes(range(56, 60)) + b"wxyz")
    finally:
        device.destroy(src)


def test_long_in_place_runs_go_through_numpy_and_arrive_intact_both_ways(device, in_place, monkeypatch):
    copied: list[int] = []
    real = wgpu_native.host_copy
    monkeypatch.setattr(wgpu_native, "GIL_FREE_COPY_BYTES", 8)  # numpy releases the GIL; short runs keep the slice
    monkeypatch.setattr(wgpu_native, "host_copy", lambda dst, src: copied.append(len(src)) or real(dst, src))
    device.copy_to_buffer(in_place, [(0, memoryview(bytes(range(100, 116)))), (40, memoryview(b"abc"))])
    long, short = memoryview(bytearray(16)), memoryview(bytearray(3))
    device.copy_from_buffer(in_place, [(0, long), (40, short)])
    assert (bytes(long), bytes(short)) == (bytes(range(100, 116)), b"abc")
    assert copied == [16, 16]


def test_a_storage_buffer_that_maps_is_unmapped_for_every_later_submit(device, in_place):
    _, dst = _buffers(device, 64)
    try:
        device.copy_to_buffer(in_place, [(0, memoryview(bytes(range(64))))])
        for _ in range(3):  # no submit may find it mapped (upload staging is mapped again after a submit)
            device.submit([Copy(in_place, 0, dst, 0, 64)])
        device.copy_from_buffer(in_place, [(0, memoryview(bytearray(4)))])
        device.submit([Copy(in_place, 0, dst, 0, 64)])
        assert bytes(asyncio.run(_read(device, dst, 0, 64))) == bytes(range(64))
    finally:
        device.destroy(dst)


def test_host_copies_in_place_are_refused_where_storage_does_not_map(unmapped_device):
    assert not unmapped_device.info.maps_storage
    buffer = unmapped_device.create_buffer(64, Usage.STORAGE | Usage.COPY_DST, "test.storage")
    try:
        for copy in (unmapped_device.copy_from_buffer, unmapped_device.copy_to_buffer):
            with pytest.raises(DeviceError, match="maps_storage"):
                copy(buffer, [(0, memoryview(bytearray(4)))])
    finally:
        unmapped_device.destroy(buffer)


def test_explicit_workgroup_counts_past_the_limit_are_refused():
    from kvckpt_web.gpu.device import Dispatch, Kernel, workgroup_counts

    dispatch = Dispatch(Kernel("k", None), b"", (), workgroups=(65536, 1, 1))
    with pytest.raises(DeviceError, match="65535"):
        workgroup_counts(dispatch, 65535)
    assert workgroup_counts(Dispatch(Kernel("k", None), b"", (), workgroups=(3, 2, 1)), 65535) == (3, 2, 1)


def test_a_destroyed_buffer_leaves_no_kept_bind_group_holding_it(device):
    from kvckpt_web.kv import kernels
    from kvckpt_web.gpu.device import Dispatch

    kept = device.create_buffer(1024, Usage.STORAGE, "test.kept")
    table = device.create_buffer(64, Usage.STORAGE, "test.table")
    dense = device.create_buffer(1024, Usage.STORAGE, "test.dense")
    dispatch = kernels.page_copy(device, "scatter", pages=kept, page_table=table, dense=dense, num_pages=0,
                                 words_per_page=4, tail_tokens=1, elem_bytes=4, head_dim=4, page_size=1,
                                 dense_word_offset=0)
    device.submit([Dispatch(dispatch.kernel, dispatch.params, dispatch.buffers, 1, keep_bindings=True)])
    device.destroy(kept)
    assert not any(kept in key[3] for key in device._bind_groups)
    device.destroy(table)
    device.destroy(dense)


def test_live_resources_count_what_is_created_until_it_is_destroyed(device):
    before = device.live_resources, device.live_bytes
    buffer = device.create_buffer(1000, Usage.STORAGE, "test.live")
    texture = device.create_texture(8, 2, 4, "test.live")
    assert (device.live_resources, device.live_bytes) == (before[0] + 2, before[1] + 1000 + 8 * 2 * 4 * 4)
    device.destroy(buffer)
    device.destroy(texture)
    device.destroy(buffer)  # again: nothing more to release
    assert (device.live_resources, device.live_bytes) == before
