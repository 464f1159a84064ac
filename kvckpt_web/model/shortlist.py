"""A sampled pick from logits on the GPU: the host reads back the highest scores it can choose among, not the
whole vocabulary (``shaders/model/shortlist.wgsl``).

:meth:`Shortlist.pick` gives the token :meth:`~kvckpt_web.model.sampler.Sampler.pick` gives from all the logits
(with the device's f32 sum of the weights as their total): the penalties go onto a copy of the logits (the
scores), then a greedy pick or ``top_k`` up to :data:`~kvckpt_web.model.kernels.TOPK_MAX` takes the top k
scores, and any other pick first reads the sum of all weights and, per window of scores within ``w`` times the
temperature of the top (:data:`WINDOWS`), how many there are and their weights' sum. The smallest window that holds
the mass the pick needs (``top_p`` of the total, or the draw's part of it) or the ``top_k`` scores is read back,
ranked on the host and drawn from; the rare draw that needs more (float64 weights summed otherwise than the
device's f32) reads the next window, up to the whole vocabulary.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence

from ..gpu.device import Buffer, Clear, Command, Copy, Device, Dispatch, Usage
from ..gpu.wgsl import source
from . import kernels
from .protocol import TokenLogprob
from .sampler import Sampler, rank

__all__ = ["WINDOWS", "Shortlist"]

WINDOWS = (2.0, 4.0, 6.0, 8.0, 12.0, 16.0, 24.0, 32.0)
"""The windows, in units of the temperature below the top score, that the device counts (``WINDOWS`` in
shortlist.wgsl)."""

CHUNK = 256
"""Scores per invocation of the chunk passes."""

FIRST_PAIRS = 2048
"""Pairs of a window copied for reading with the statistics; a wider window's others are copied once its count is
known (copying the whole vocabulary's every pick would move 2 MB a token for Gemma 3's 262,144 tokens)."""

_STRIDE = 17  # the total, then the windows' counts and masses (1 + 2 * len(WINDOWS))
_F32_MAX = 3.4028234663852886e38
_SLACK = 1e-3
"""How much more than it needs a window's f32 mass must hold to be read (the host sums its weights in float64)."""


class Shortlist:
    """The device buffers of sampled picks from a ``vocab``-sized logits buffer, and the picks."""

    def __init__(self, device: Device, vocab: int) -> None:
        self.device = device
        self.vocab = vocab
        self.chunks = -(-vocab // CHUNK)
        storage = Usage.STORAGE
        self.scores = device.create_buffer(4 * vocab, storage | Usage.COPY_DST, "shortlist.scores")
        self._maxima = device.create_buffer(4 * self.chunks, storage, "shortlist.maxima")
        self._partial = device.create_buffer(4 * _STRIDE * self.chunks, storage, "shortlist.partial")
        self._stats = device.create_buffer(4 * (_STRIDE + 1), storage | Usage.COPY_SRC | Usage.COPY_DST,
                                           "shortlist.stats")
        self._count = device.create_buffer(4, storage | Usage.COPY_SRC | Usage.COPY_DST, "shortlist.count")
        self._pairs = device.create_buffer(8 * vocab, storage | Usage.COPY_SRC, "shortlist.pairs")
        self._candidates = device.create_buffer(kernels.topk_candidates_bytes(vocab, kernels.TOPK_MAX), storage,
                                                "shortlist.topk_candidates")
        self._best = device.create_buffer(8 * kernels.TOPK_MAX, storage | Usage.COPY_SRC, "shortlist.topk")
        self._readback = device.create_buffer(4 * (_STRIDE + 1) + 8 + 8 * vocab, Usage.MAP_READ | Usage.COPY_DST,
                                              "shortlist.readback")
        self._listed: list[Buffer | None] = [None, None]  # the ids of the scale pass, the (id, offset) pairs of shift

    def close(self) -> None:
        """Release the device buffers."""
        for buffer in (self.scores, self._maxima, self._partial, self._stats, self._count, self._pairs,
                       self._candidates, self._best, self._readback, *self._listed):
            if buffer is not None:
                self.device.destroy(buffer)
        self._listed = [None, None]

    async def pick(self, logits: Buffer, sampler: Sampler, previous: Sequence[int], generated: Sequence[int],
                   row: int = 0) -> int:
        """The token ``sampler`` chooses from row ``row`` of ``logits`` (``vocab`` f32 logits a row), after
        ``previous`` (the token ids seen so far; ``generated`` this reply's)."""
        s, n = sampler.settings, self.vocab
        inv_t = min(1 / s.temperature, _F32_MAX) if s.temperature else 0.0
        commands: list[Command] = [Copy(logits, 4 * row * n, self.scores, 0, 4 * n)]
        if sampler.penalizes:
            commands += self._penalties(sampler, previous, generated)
        if s.greedy or s.top_k <= kernels.TOPK_MAX and s.top_k:
            k = 1 if s.greedy else min(s.top_k, n)
            data = await self._read(commands + kernels.topk(self.device, self.scores, n, k, self._candidates,
                                                            self._best), self._best, 8 * k)
            token = sampler.draw([(i, score) for score, i in struct.iter_unpack("<fI", data)], 0.0, complete=True)
            assert token is not None
            return token
        fraction = 0.0 if s.top_k else sampler.mass_needed(1.0) * (1 + _SLACK)
        total, edge, ranked = await self._collect(inv_t, commands + self._sums(inv_t, fraction, s.top_k))
        while True:
            token = sampler.draw(ranked, total, complete=len(ranked) == n)
            if token is not None:
                return token
            edge = next((w for w in WINDOWS if w > edge), math.inf)
            self.device.write(self._stats, 4 * _STRIDE, struct.pack("<f", edge))
            _, _, ranked = await self._collect(inv_t, [])

    async def logprobs(self, logits: Buffer, token: int, top: int, row: int = 0) -> TokenLogprob:
        """The log-softmax of row ``row`` of ``logits`` (``vocab`` f32 logits a row; the device's f32 sum of
        ``exp(logit - max)`` over all of them) at ``token`` and at the ``top`` largest logits."""
        k, first = max(top, 1), row * self.vocab
        commands = [Copy(logits, 4 * first, self.scores, 0, 4 * self.vocab), *self._sums(1.0, 0.0, 0),
                    *kernels.topk(self.device, logits, self.vocab, k, self._candidates, self._best, first=first),
                    Copy(self._stats, 0, self._readback, 0, 4), Copy(logits, 4 * (first + token), self._readback, 4, 4),
                    Copy(self._best, 0, self._readback, 8, 8 * k)]
        data = await self._read(commands, None, 8 + 8 * k)
        total, logit = struct.unpack_from("<2f", data)
        best = list(struct.iter_unpack("<fI", data[8:]))
        base = best[0][0] + math.log(total)  # the log of the sum of exp(logit) over the vocabulary
        return TokenLogprob(token, logit - base, tuple((i, score - base) for score, i in best[:top]))

    def _dispatch(self, entry: str, params: bytes, buffers: tuple[Buffer, ...], workgroups: int) -> Dispatch:
        kernel = self.device.kernel("model.shortlist", source("model", "shortlist"), entry)
        return Dispatch(kernel, params, buffers, workgroups=(workgroups, 1, 1), keep_bindings=True)

    def _params(self, inv_t: float = 0.0, fraction: float = 0.0, listed: int = 0,
                factors: tuple[float, float] = (1.0, 1.0), top_k: int = 0) -> bytes:
        return struct.pack("<4I4f4I", self.vocab, CHUNK, self.chunks, listed, inv_t, fraction, *factors, top_k, 0, 0, 0)

    def _penalties(self, sampler: Sampler, previous: Sequence[int], generated: Sequence[int]) -> list[Command]:
        """The dispatches that apply the repetition penalty to the scores of the tokens of ``previous``, then the
        presence and frequency penalties to those of ``generated``: each its own dispatch, so no device fuses the
        product and the difference into one rounding."""
        seen = sorted(set(previous)) if sampler.settings.repetition_penalty != 1 else []
        offsets = sampler.offsets(generated)
        commands: list[Command] = []
        if seen:
            params = self._params(listed=len(seen), factors=sampler.penalty_factors())
            commands.append(self._dispatch("scale", params, (self.scores, self._upload(0, "<I", seen)),
                                           -(-len(seen) // kernels.WORKGROUP)))
        if offsets:
            pairs = [v for t, offset in sorted(offsets.items()) for v in (t, _bits(offset))]
            commands.append(self._dispatch("shift", self._params(listed=len(offsets)),
                                           (self.scores, self._upload(1, "<I", pairs)),
                                           -(-len(offsets) // kernels.WORKGROUP)))
        return commands

    def _upload(self, which: int, kind: str, values: list[int]) -> Buffer:
        """Listed buffer ``which`` (grown as needed) holding ``values``."""
        buffer = self._listed[which]
        if buffer is None or buffer.size < 4 * len(values):
            if buffer is not None:
                self.device.destroy(buffer)
            buffer = self.device.create_buffer(4 * max(len(values), 256), Usage.STORAGE | Usage.COPY_DST,
                                               f"shortlist.listed{which}")
            self._listed[which] = buffer
        self.device.write(buffer, 0, struct.pack(f"{kind[0]}{len(values)}{kind[1]}", *values))
        return buffer

    def _sums(self, inv_t: float, fraction: float, top_k: int) -> list[Command]:
        """The dispatches that leave the total, the windows' counts and masses and the window to read in the stats
        buffer."""
        params, groups = self._params(inv_t, fraction, top_k=top_k), -(-self.chunks // kernels.WORKGROUP)
        return [self._dispatch("chunk_max", params, (self.scores, self._maxima), groups),
                self._dispatch("chunk_sums", params, (self.scores, self._maxima, self._partial), groups),
                self._dispatch("merge", params, (self._partial, self._stats), 1)]

    async def _collect(self, inv_t: float, before: list[Command]) -> tuple[float, float, list[tuple[int, float]]]:
        """After ``before``, the total and the window the stats buffer holds and the (token id, score) pairs within
        the window, ranked."""
        head = 4 * (_STRIDE + 1) + 8  # the stats, then the count, then the pairs
        self.device.submit(before + [
            Clear(self._count, 0, 4),
            self._dispatch("collect", self._params(inv_t), (self.scores, self._maxima, self._count, self._pairs,
                                                            self._stats), -(-self.chunks // kernels.WORKGROUP)),
            Copy(self._stats, 0, self._readback, 0, 4 * (_STRIDE + 1)),
            Copy(self._count, 0, self._readback, head - 8, 4),
            Copy(self._pairs, 0, self._readback, head, 8 * min(self.vocab, FIRST_PAIRS))])
        *stats, count = struct.unpack(f"<{_STRIDE + 1}fI", await self.device.read(self._readback, 0, head - 4))
        if count > FIRST_PAIRS:
            self.device.submit([Copy(self._pairs, 8 * FIRST_PAIRS, self._readback, head + 8 * FIRST_PAIRS,
                                     8 * (count - FIRST_PAIRS))])
        data = await self.device.read(self._readback, head, 8 * count) if count else b""
        return stats[0], stats[_STRIDE], sorted(((i, score) for score, i in struct.iter_unpack("<fI", data)), key=rank)

    async def _read(self, commands: list[Command], src: Buffer | None, size: int) -> memoryview:
        """Run ``commands``, then read back ``size`` bytes of ``src`` (None: the readback buffer as they leave it)."""
        self.device.submit(commands + ([] if src is None else [Copy(src, 0, self._readback, 0, size)]))
        return await self.device.read(self._readback, 0, size)


def _bits(value: float) -> int:
    """The bits of the f32 ``value``."""
    return struct.unpack("<I", struct.pack("<f", value))[0]
