"""Page groups on the host: every layer's dense page group of one sequence, as views into one host buffer
(:class:`PageGroups`) or into mapped memory (:class:`MappedPages`)."""

from __future__ import annotations

from typing import Callable

from ..checks import check_buffer, check_int
from ..errors import TensorError
from ..gpu.tensors import span_bytes, zeroed


def _check_spacing(group_bytes: int, count: int, stride: int | None) -> int:
    """The stride of ``count`` groups of ``group_bytes`` (``group_bytes`` unless ``stride`` says), once all three
    are integers >= 0."""
    check_int("PageGroups.group_bytes", group_bytes, 0, error=TensorError)
    check_int("PageGroups.count", count, 0, error=TensorError)
    return group_bytes if stride is None else check_int("PageGroups.stride", stride, 0, error=TensorError)


class PageGroups(tuple):
    """Page groups as views into one host buffer, group g at ``g * stride`` (what ``export_groups`` returns).

    ``host`` spans every group and the bytes between them; ``import_groups`` uploads it in one host
    copy. A tuple, so the views and ``host`` cannot drift apart.
    """

    host: memoryview
    stride: int
    group_bytes: int

    def __new__(cls, host: memoryview, group_bytes: int, count: int, stride: int | None = None) -> "PageGroups":
        host = check_buffer("PageGroups.host", host, error=TensorError)
        stride = _check_spacing(group_bytes, count, stride)
        span = span_bytes(count, group_bytes, stride)
        if stride < group_bytes or len(host) < span:
            raise TensorError("PageGroups.host.nbytes", f"at least {span} ({count} groups of {group_bytes} bytes "
                              f"every {stride} bytes)", len(host))
        self = super().__new__(cls, (host[g * stride:g * stride + group_bytes] for g in range(count)))
        self.host, self.stride, self.group_bytes = host[:span], stride, group_bytes
        return self

    @classmethod
    def zeros(cls, count: int, group_bytes: int, stride: int | None = None) -> "PageGroups":
        """``count`` zeroed groups in a new host buffer."""
        stride = _check_spacing(group_bytes, count, stride)
        return cls(zeroed(span_bytes(count, group_bytes, stride)), group_bytes, count, stride)


class MappedPages:
    """Page groups viewed in mapped device memory (see :meth:`~kvckpt_web.kv.cache.PagedKVCache.map_pages`)."""

    def __init__(self, groups: list[memoryview], unmap: Callable[[], None] | None) -> None:
        self.groups = groups
        self._unmap = unmap

    def release(self) -> None:
        """Unmap; the group views must no longer be used. Calling it again does nothing."""
        unmap, self._unmap = self._unmap, None
        if unmap is not None:
            unmap()
