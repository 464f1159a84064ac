"""The one command-encoding loop of the WebGPU backends.

:class:`EncodingDevice` implements :meth:`~kvckpt_web.gpu.device.Device.encode` once: kernel parameters
uploaded, copies, texture copies and clears recorded in order, consecutive dispatches sharing one compute
pass. A backend supplies only what differs: how its parameters reach the device and a :class:`Recorder` over
its native command encoder.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from typing import Any

from .device import (Buffer, Clear, Command, Copy, CopyRuns, Device, Dispatch, Texture, TextureCopy, uniform_params,
                     workgroup_counts)

__all__ = ["EncodingDevice", "Recorder"]


class Recorder(ABC):
    """One native command encoder of a backend, which :meth:`EncodingDevice.encode` records into."""

    @abstractmethod
    def copy(self, src: Buffer, dst: Buffer, runs: Iterable[tuple[int, int, int]]) -> None:
        """Record a copy of each ``(src_offset, dst_offset, size)`` of ``runs`` from ``src`` to ``dst``."""

    @abstractmethod
    def copy_texture(self, texture: Texture, buffer: Buffer, offset: int) -> None:
        """Record a copy of all of ``texture`` into ``buffer`` at ``offset`` (rows ``texture.row_pitch`` apart)."""

    @abstractmethod
    def clear(self, buffer: Buffer, offset: int, size: int) -> None:
        """Record zeroing ``size`` bytes of ``buffer`` at ``offset``."""

    @abstractmethod
    def begin_pass(self) -> Any:
        """Open a compute pass: its native handle, which the loop closes with ``end()``."""

    @abstractmethod
    def dispatch(self, compute: Any, pipeline: Any, bind_group: Any, counts: tuple[int, int, int]) -> None:
        """Record, in the open pass ``compute``, a dispatch of ``counts`` workgroups of ``pipeline`` with
        ``bind_group`` as group 0."""

    @abstractmethod
    def finish(self) -> Any:
        """The encoded commands, as the backend's :meth:`~kvckpt_web.gpu.device.Device.commit` takes them."""


class EncodingDevice(Device):
    """A :class:`~kvckpt_web.gpu.device.Device` whose :meth:`encode` is the shared loop."""

    def encode(self, commands: list[Command]) -> Any:
        blob, offsets = uniform_params(commands)
        params = self._upload_params(blob) if blob else None
        slots = iter(offsets)
        recorder = self._recorder()
        compute = None  # the open compute pass, shared by consecutive dispatches
        for command in commands:
            if compute is not None and not isinstance(command, Dispatch):
                compute.end()
                compute = None
            if isinstance(command, Copy):
                recorder.copy(command.src, command.dst, ((command.src_offset, command.dst_offset, command.size),))
            elif isinstance(command, CopyRuns):
                recorder.copy(command.src, command.dst, command.runs)
            elif isinstance(command, TextureCopy):
                recorder.copy_texture(command.texture, command.buffer, command.offset)
            elif isinstance(command, Clear):
                recorder.clear(command.buffer, command.offset, command.size)
            else:
                bind_group = self.bind_group(params, next(slots), command)
                if compute is None:
                    compute = recorder.begin_pass()
                recorder.dispatch(compute, command.kernel.native, bind_group,
                                  workgroup_counts(command, self.info.max_workgroups_per_dim))
        if compute is not None:
            compute.end()
        return recorder.finish()

    @abstractmethod
    def _upload_params(self, blob: bytes) -> Any:
        """The native uniform buffer of kernel parameters (grown as needed), ``blob`` queued into it from its
        start: written at encoding, it serves the next commit (so bind groups that bind it can be kept)."""

    @abstractmethod
    def _recorder(self) -> Recorder:
        """A :class:`Recorder` over a new native command encoder."""
