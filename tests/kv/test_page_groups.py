"""Page groups: every layer's dense page group of one sequence as views into one host buffer."""

from __future__ import annotations

import pytest

from kvckpt_web import PageGroups, TensorError


def test_page_groups_view_one_host_buffer_at_their_stride():
    host = memoryview(bytearray(b"aaaa--bbbb--cccc"))
    groups = PageGroups(host, 4, 3, stride=6)
    assert [bytes(g) for g in groups] == [b"aaaa", b"bbbb", b"cccc"]
    assert (bytes(groups.host), groups.stride, groups.group_bytes) == (b"aaaa--bbbb--cccc", 6, 4)


def test_page_groups_refuse_a_host_buffer_too_small_for_their_groups():
    with pytest.raises(TensorError) as info:
        PageGroups(memoryview(bytearray(15)), 4, 3, stride=6)
    assert (info.value.field, info.value.got) == ("PageGroups.host.nbytes", 15)
    assert "at least 16" in str(info.value)


def test_page_groups_zeros_are_dense_by_default():
    groups = PageGroups.zeros(3, 4)
    assert groups.stride == 4 and bytes(groups.host) == bytes(12)
