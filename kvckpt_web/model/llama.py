"""A llama-style model (SmolLM2-135M and its kin, Llama 3, Qwen2, Qwen 3, Gemma 3) running on the WGSL kernels
over a paged cache.

:class:`LlamaModel` implements :class:`~kvckpt_web.model.protocol.CausalLM`. Loading checks every tensor of
the GGUF file (:mod:`~kvckpt_web.model.llama_tensors`: presence, GGUF shape, ggml type) before anything is
uploaded, and puts the weights on the device still quantized. A ``llama`` GGUF stores the rows of ``attn_q``/``attn_k`` permuted for ggml's adjacent-pair
RoPE; they are put back in Hugging Face order while the projections are fused into one Q/K/V matrix (the other
architectures store them in that order), so the kernels apply rotate-half RoPE (rope_mode "normal") and the K in
the cache is the K a TVM/WebLLM build of the model keeps. What each architecture adds to the block
(:mod:`~kvckpt_web.model.config`) runs as small kernels of its own (:mod:`~kvckpt_web.model.row_kernels`); the
RoPE rates and sliding windows of each layer are the attention's (:class:`PagedAttention`). A forward encodes every
layer of a prefill chunk (or a decode step) into one submit and leaves the logits on the GPU: :class:`GPULogits`
reads back only the argmax or the top k.

Pure Python over the device layer (struct, memoryview): it runs in Pyodide as on the desktop.
"""

from __future__ import annotations

import heapq
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..errors import CapacityError, CheckpointStateError, FieldError, SequenceError
from ..gpu import wgsl
from ..gpu.device import Buffer, Command, Copy, CopyRuns, Device, Texture, Usage
from ..tvm.layout import KVLayout
from . import kernels, row_kernels
from .attention import PagedAttention
from .config import LlamaConfig
from .gguf import GGUFFile, GGUFTensor
from .llama_tensors import POST_NORMS, check_tensors, hf_row_order, reordered_rows, rope_rates
from .protocol import MAX_TOP_LOGPROBS, TokenLogprob
from .sampler import Sampler
from .shortlist import Shortlist
from .weights import (F32, Q4_1, DenseTensor, DeviceTensor, QuantizedTensor, destroy_tensor, upload_stacked,
                      upload_tensor)

if TYPE_CHECKING:
    from ..kv.cache import PagedKVCache

@dataclass(frozen=True)
class _Layer:
    attn_norm: DenseTensor
    qkv: tuple[QuantizedTensor, ...]
    """Q, K and V rows: one stacked matrix where they share a type, else each its own (see :func:`_fused`)."""
    attn_output: QuantizedTensor
    ffn_norm: DenseTensor
    gate_up: tuple[QuantizedTensor, ...]
    """The gate rows, then the up rows, as ``qkv``; with ``gated`` the two Q4_1 matrices of the SwiGLU product."""
    gated: bool
    ffn_down: QuantizedTensor
    qkv_bias: DenseTensor | None = None
    qk_norm: DenseTensor | None = None
    """Q's norm weights, then K's."""
    post_attention_norm: DenseTensor | None = None
    post_ffw_norm: DenseTensor | None = None

    def tensors(self) -> list[DeviceTensor]:
        return [t for t in (self.attn_norm, *self.qkv, self.attn_output, self.ffn_norm, *self.gate_up, self.ffn_down,
                            self.qkv_bias, self.qk_norm, self.post_attention_norm, self.post_ffw_norm)
                if t is not None]


def _fused(device: Device, name: str, parts: list[tuple[GGUFTensor, bytes]]) -> tuple[QuantizedTensor, ...]:
    """Matrices (a tensor of the file and its rows' bytes) whose rows one product writes one after another: one
    stacked matrix where they share a type, else each its own, their products placed side by side."""
    if len({t.type for t, _ in parts}) == 1:
        return (upload_stacked(device, name, [(t.type, t.shape, data) for t, data in parts]),)
    return tuple(upload_tensor(device, t.name, t.type, t.shape, data) for t, data in parts)  # type: ignore[misc]


class _Scratch:
    """The activations of forwards of up to ``tokens`` tokens: buffers where the products write, textures where
    they read (``kernels.activation_texture``)."""

    def __init__(self, device: Device, c: LlamaConfig, tokens: int, gate_up: bool, parts: bool) -> None:
        self.tokens = tokens
        self.ids = device.create_buffer(4 * tokens, Usage.STORAGE | Usage.COPY_DST, "llama.ids")
        self.residual = device.create_buffer(4 * tokens * c.hidden, Usage.STORAGE | Usage.COPY_SRC,
                                             "llama.residual")
        # the last rows of a forward's runs, gathered for the final norm and the head
        self.lasts = device.create_buffer(4 * tokens * c.hidden, Usage.STORAGE | Usage.COPY_DST, "llama.lasts")
        self.qkv = device.create_buffer(4 * tokens * (c.q_rows + 2 * c.kv_rows), Usage.STORAGE, "llama.qkv")
        self.normed = kernels.activation_texture(device, c.hidden, tokens, "llama.normed")
        self.attn = kernels.activation_texture(device, c.q_rows, tokens, "llama.attn")
        self.ffn = kernels.activation_texture(device, c.ffn, tokens, "llama.ffn")
        # a block's output before its norm (post norms), the gate/up rows (unless the SwiGLU product makes ffn), one
        # matrix's product before it is placed beside the others' (matrices of several types)
        self.block_out = device.create_buffer(4 * tokens * c.hidden, Usage.STORAGE, "llama.block_out") \
            if c.post_norms else None
        self.gate_up = device.create_buffer(8 * tokens * c.ffn, Usage.STORAGE, "llama.gate_up") if gate_up else None
        self.part = device.create_buffer(4 * tokens * max(c.q_rows, c.ffn), Usage.STORAGE, "llama.part") \
            if parts else None

    def destroy(self, device: Device) -> None:
        for resource in (self.ids, self.residual, self.lasts, self.qkv, self.normed, self.attn, self.ffn,
                         self.block_out, self.gate_up, self.part):
            if resource is not None:
                device.destroy(resource)


class LlamaModel:
    """A llama GGUF model on ``device``: :class:`~kvckpt_web.model.protocol.CausalLM` over a PagedKVCache."""

    def __init__(self, f: GGUFFile, device: Device, progress: Callable[[int, int], None] | None = None) -> None:
        """Upload ``f``'s weights to ``device``; ``progress(done, total)`` hears of each layer's weights and, last,
        of the embedding, head and output norm."""
        c = LlamaConfig.from_gguf(f)
        check_tensors(f, c)
        self.config = c
        self.device = device
        self.identity = f.digest
        self.kernels = wgsl.digest("model", "kv")
        self.max_context = c.max_context
        self.vocab_size = c.vocab

        def upload(name: str) -> QuantizedTensor | DenseTensor:
            t = f.tensors[name]
            return upload_tensor(device, name, t.type, t.shape, t.data)

        def dense(name: str, parts: tuple[str, ...]) -> DenseTensor:
            """F32 vectors ``parts`` of the file in one device tensor ``name``."""
            data = b"".join(bytes(f.tensors[p].data) for p in parts)
            return upload_tensor(device, name, F32, (len(data) // 4,), data)  # type: ignore[return-value]

        rows = c.q_rows, c.kv_rows
        q_order, k_order = (hf_row_order(n, c.head_dim) if c.permuted_qk else list(range(n)) for n in rows)
        self.layers: list[_Layer] = []
        for i in range(c.num_layers):
            blk = f"blk.{i}"
            q, k, v = (f.tensors[f"{blk}.{n}.weight"] for n in ("attn_q", "attn_k", "attn_v"))
            qkv = _fused(device, f"{blk}.attn_qkv",
                         [(q, reordered_rows(q, q_order)), (k, reordered_rows(k, k_order)), (v, v.data)])
            gate, up = (f.tensors[f"{blk}.{n}.weight"] for n in ("ffn_gate", "ffn_up"))
            gated = c.activation == "silu" and gate.type == up.type == Q4_1  # the fused SwiGLU product
            gate_up = tuple(upload(t.name) for t in (gate, up)) if gated \
                else _fused(device, f"{blk}.ffn_gate_up", [(gate, gate.data), (up, up.data)])
            self.layers.append(_Layer(
                upload(f"{blk}.attn_norm.weight"), qkv, upload(f"{blk}.attn_output.weight"),  # type: ignore[arg-type]
                upload(f"{blk}.ffn_norm.weight"), gate_up, gated,  # type: ignore[arg-type]
                upload(f"{blk}.ffn_down.weight"),  # type: ignore[arg-type]
                qkv_bias=dense(f"{blk}.attn_qkv.bias", tuple(f"{blk}.attn_{n}.bias" for n in "qkv"))
                if c.qkv_bias else None,
                qk_norm=dense(f"{blk}.attn_qk_norm", (f"{blk}.attn_q_norm.weight", f"{blk}.attn_k_norm.weight"))
                if c.qk_norm else None,
                **({n: upload(f"{blk}.{n}.weight") for n in POST_NORMS} if c.post_norms else {})))
            if progress is not None:
                progress(i + 1, c.num_layers + 1)
        factors = list(f.tensors["rope_freqs.weight"].data.cast("f")) if "rope_freqs.weight" in f.tensors else None
        self.rope_rates = rope_rates(c, factors)
        """Per layer, RoPE's angle rate of each pair (the base of the layer's kind, the scaling, the factors)."""
        self.embedding = upload("token_embd.weight")
        self.head = upload("output.weight") if "output.weight" in f.tensors else self.embedding
        self.output_norm = upload("output_norm.weight")
        if progress is not None:
            progress(c.num_layers + 1, c.num_layers + 1)
        self.logits = device.create_buffer(4 * c.vocab, Usage.STORAGE | Usage.COPY_SRC, "llama.logits")
        self._candidates = device.create_buffer(kernels.topk_candidates_bytes(c.vocab, kernels.TOPK_MAX),
                                                Usage.STORAGE, "llama.topk_candidates")
        self._best = device.create_buffer(8 * kernels.TOPK_MAX, Usage.STORAGE | Usage.COPY_SRC, "llama.topk")
        self._readback = device.create_buffer(4 * max(c.vocab, 2 * kernels.TOPK_MAX),
                                              Usage.MAP_READ | Usage.COPY_DST, "llama.readback")
        self._shortlist = Shortlist(device, c.vocab)
        self._scratch: _Scratch | None = None
        self._attention: PagedAttention | None = None
        self.forwards = 0
        """How many forward passes ran (a :class:`GPULogits` is valid until the next one)."""
        self.closed = False
        """Whether :meth:`close` has released the model's device memory."""
        device.submit([])

    def close(self) -> None:
        """Release every device buffer and texture of this model now (weights, activations, the attention's
        buffers); every later forward or read of logits raises CheckpointStateError. Closing again does
        nothing. The caches it ran over stay open."""
        if self.closed:
            return
        self.closed = True
        weights: list[DeviceTensor] = [self.embedding, self.head, self.output_norm]
        for layer in self.layers:
            weights += layer.tensors()
        for tensor in {id(t): t for t in weights}.values():  # the head may be the embedding
            destroy_tensor(self.device, tensor)
        for buffer in (self.logits, self._candidates, self._best, self._readback):
            self.device.destroy(buffer)
        self._shortlist.close()
        if self._scratch is not None:
            self._scratch.destroy(self.device)
        if self._attention is not None:
            self._attention.close()
        self.layers, self._scratch, self._attention = [], None, None

    def _check_open(self, operation: str) -> None:
        if self.closed:
            raise CheckpointStateError(f"{operation}: expected an open model, got a closed one (close() was called)")

    def kv_layout(self, page_size: int = 16) -> KVLayout:
        """Float16 K/V of every layer, RoPE (rope_mode "normal", the file's theta) applied as K is written; the
        sliding-window layers (Gemma 3) marked "mha_sliding" with their window and RoPE base (FORMAT.md section
        11), every token's K/V kept in them too."""
        c = self.config
        kinds = tuple("mha_sliding" if c.sliding(i) else "mha" for i in range(c.num_layers))
        sliding = {"attn_kinds": kinds, "support_layer_sliding_window": True, "sliding_window": c.sliding_window,
                   "sliding_rotary_theta": c.rope_theta_local} if "mha_sliding" in kinds else {}
        return KVLayout(page_size=page_size, num_layers=c.num_layers, num_qo_heads=c.num_qo_heads,
                        num_kv_heads=c.num_kv_heads, qk_head_dim=c.head_dim, dtype="float16", rope_mode="normal",
                        rotary_theta=c.rope_theta, **sliding)

    async def forward(self, cache: "PagedKVCache", seq_id: int, tokens: list[int]) -> "GPULogits":
        """Run ``tokens`` after what ``seq_id`` holds, in chunks of the cache's prefill_chunk_size, and return
        the last token's logits (on the GPU)."""
        self._check_run("forward", cache, "tokens", tokens)
        chunk = self._chunk(cache)
        for start in range(0, len(tokens), chunk):
            self._run(cache, [(seq_id, tokens[start:start + chunk])], head=start + chunk >= len(tokens))
        return GPULogits(self, self.forwards, 0)

    async def forward_batch(self, cache: "PagedKVCache", runs: list[tuple[int, list[int]]]) -> list["GPULogits"]:
        """Run each (seq_id, tokens) of ``runs`` after what its sequence holds, in one forward pass of the cache,
        and return each run's last-token logits (on the GPU), in the order of ``runs``: the same bits as a
        :meth:`forward` of that run alone. All the runs' tokens together fit one forward (the cache's
        prefill_chunk_size)."""
        if not isinstance(runs, list) or not runs:
            raise SequenceError(f"runs: expected a non-empty list of (seq_id, tokens), got {runs!r}")
        for r, run in enumerate(runs):
            if not isinstance(run, tuple) or len(run) != 2:
                raise SequenceError(f"runs[{r}]: expected a (seq_id, tokens) pair, got {run!r}")
            self._check_run("forward_batch", cache, f"runs[{r}].tokens", run[1])
        total, chunk = sum(len(tokens) for _, tokens in runs), self._chunk(cache)
        if total > chunk:
            raise CapacityError(f"runs: expected at most {chunk} tokens in all (one forward of the cache), "
                                f"got {total}")
        self._run(cache, runs, head=True)
        return [GPULogits(self, self.forwards, row) for row in range(len(runs))]

    def _check_run(self, operation: str, cache: "PagedKVCache", name: str, tokens: list[int]) -> None:
        """Errors unless the model is open, ``tokens`` (named ``name``) are token ids, at least one, and ``cache``
        has this model's layout."""
        self._check_open(operation)
        if not isinstance(tokens, list) or not tokens:
            raise SequenceError(f"{name}: expected at least one token id, got {tokens!r}")
        for i, t in enumerate(tokens):
            if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < self.vocab_size:
                raise SequenceError(f"{name}[{i}]: expected a token id in [0, {self.vocab_size}), got {t!r}")
        if cache.layout != self.kv_layout(cache.layout.page_size):
            raise FieldError("cache.layout", f"this model's {self.kv_layout(cache.layout.page_size)}", cache.layout)

    def _chunk(self, cache: "PagedKVCache") -> int:
        """The most tokens of one forward: the cache's prefill_chunk_size, a token a texture row."""
        return min(cache.limits.prefill_chunk_size, self.device.info.max_texture_dim)

    def _run(self, cache: "PagedKVCache", runs: list[tuple[int, list[int]]], head: bool) -> None:
        """One forward pass of ``runs`` (their tokens one after another), with the logits of each run's last token
        if ``head``."""
        attention = self._attention_for(cache)
        ids = [t for _, tokens in runs for t in tokens]
        scratch = self._scratch_for(len(ids))
        cache.begin_forward([seq_id for seq_id, _ in runs], [len(tokens) for _, tokens in runs])
        try:
            self.device.write(scratch.ids, 0, struct.pack(f"<{len(ids)}I", *ids))
            lasts, row = [], -1
            for _, tokens in runs if head else ():
                row += len(tokens)
                lasts.append(row)
            self.device.submit(self._encode(attention, scratch, len(ids), lasts))
        finally:
            cache.end_forward()
        self.forwards += 1

    def _attention_for(self, cache: "PagedKVCache") -> PagedAttention:
        if self._attention is None or self._attention.cache is not cache:
            if self._attention is not None:
                self._attention.close()
            c = self.config
            self._attention = PagedAttention(cache, rope_rates=self.rope_rates, scale=c.attention_scale,
                                             windows=[c.sliding_window if c.sliding(i) else 0
                                                      for i in range(c.num_layers)])
        return self._attention

    def _scratch_for(self, tokens: int) -> _Scratch:
        if self._scratch is None or self._scratch.tokens < tokens:
            if self._scratch is not None:
                self._scratch.destroy(self.device)
            layers = self.layers
            self._scratch = _Scratch(self.device, self.config, tokens, any(not layer.gated for layer in layers),
                                     any(len(layer.qkv) > 1 or len(layer.gate_up) > 1 for layer in layers))
        return self._scratch

    def _encode(self, attention: PagedAttention, s: _Scratch, n: int, lasts: list[int]) -> list[Command]:
        """The commands of one forward pass of ``n`` tokens, then the final norm and the head of rows ``lasts``
        (logits row i: row ``lasts[i]``)."""
        c, d = self.config, self.device
        eps = c.rms_eps
        commands: list[Command] = [kernels.embed(d, self.embedding, s.ids, s.residual, n)]  # type: ignore[arg-type]
        if c.embedding_scale != 1.0:
            commands.append(row_kernels.scale(d, s.residual, n, c.hidden, c.embedding_scale))
        for i, layer in enumerate(self.layers):
            commands.append(kernels.rms_norm(d, s.residual, layer.attn_norm, s.normed, n, eps))
            commands += self._rows_product(layer.qkv, s.qkv, s, n)
            if layer.qkv_bias is not None:
                commands.append(row_kernels.add_bias(d, s.qkv, layer.qkv_bias, n))
            if layer.qk_norm is not None:
                commands.append(row_kernels.head_norm(d, s.qkv, layer.qk_norm, n, c.num_qo_heads, c.num_kv_heads,
                                                      c.head_dim, eps))
            commands.append(attention.rope_append(i, s.qkv))
            commands += attention.attend(i, s.qkv, s.attn)
            commands += self._into_residual(layer.attn_output, s.attn, layer.post_attention_norm, s, n)
            commands.append(kernels.rms_norm(d, s.residual, layer.ffn_norm, s.normed, n, eps))
            if layer.gated:
                commands += kernels.gated(d, *layer.gate_up, s.normed, s.ffn, n)
            else:  # the gate/up rows, then the activation
                assert s.gate_up is not None
                commands += self._rows_product(layer.gate_up, s.gate_up, s, n)
                commands.append(row_kernels.glu(d, s.gate_up, s.ffn, n, c.ffn, c.activation))
            commands += self._into_residual(layer.ffn_down, s.ffn, layer.post_ffw_norm, s, n)
        if lasts:  # those rows only, gathered
            row = 4 * c.hidden
            commands.append(CopyRuns(s.residual, s.lasts, tuple((r * row, i * row, row) for i, r in enumerate(lasts))))
            commands.append(kernels.rms_norm(d, s.lasts, self.output_norm,  # type: ignore[arg-type]
                                             s.normed, len(lasts), eps))
            commands += kernels.matvec(d, self.head, s.normed, self._logits_for(len(lasts)),  # type: ignore[arg-type]
                                       len(lasts))
        return commands

    def _logits_for(self, rows: int) -> Buffer:
        """The logits buffer, grown to ``rows`` rows of the vocabulary if smaller."""
        if self.logits.size < 4 * rows * self.vocab_size:
            self.device.destroy(self.logits)
            self.logits = self.device.create_buffer(4 * rows * self.vocab_size, Usage.STORAGE | Usage.COPY_SRC,
                                                    "llama.logits")
        return self.logits

    def _rows_product(self, parts: tuple[QuantizedTensor, ...], out: Buffer, s: _Scratch, n: int) -> list[Command]:
        """The product of ``parts`` (:func:`_fused`) and the normalized rows, into ``out``: each token's rows of the
        parts side by side."""
        if len(parts) == 1:
            return kernels.matvec(self.device, parts[0], s.normed, out, n)
        assert s.part is not None
        commands: list[Command] = []
        width, offset = sum(part.rows for part in parts), 0
        for part in parts:
            commands += kernels.matvec(self.device, part, s.normed, s.part, n)
            commands.append(row_kernels.place(self.device, out, s.part, n, width, offset, part.rows))
            offset += part.rows
        return commands

    def _into_residual(self, weight: QuantizedTensor, x: Texture, post_norm: DenseTensor | None, s: _Scratch,
                       n: int) -> list[Command]:
        """The product of ``weight`` and ``x`` added into the residual, normalized by ``post_norm`` first if any."""
        if post_norm is None:
            return kernels.matvec(self.device, weight, x, s.residual, n, accumulate=True)
        assert s.block_out is not None
        return kernels.matvec(self.device, weight, x, s.block_out, n) + \
            [row_kernels.norm_add(self.device, s.residual, post_norm, s.block_out, n, self.config.rms_eps)]

    async def top_k(self, k: int, row: int = 0) -> list[tuple[int, float]]:
        """The ``k`` largest logits of row ``row`` of the last forward as (token id, logit), largest first, ties
        lower id first: picked on the GPU up to :data:`kernels.TOPK_MAX`, beyond that from all logits read back."""
        self._check_open("top_k")
        n = self.vocab_size
        k = max(1, min(k, n))
        if k <= kernels.TOPK_MAX:
            picks = kernels.topk(self.device, self.logits, n, k, self._candidates, self._best, first=row * n)
            pairs = struct.unpack(f"<{2 * k}I", await self._read(picks, self._best, 0, 8 * k))
            return [(pairs[2 * j + 1], _f32(pairs[2 * j])) for j in range(k)]
        values = struct.unpack(f"<{n}f", await self._read([], self.logits, 4 * row * n, 4 * n))
        return [(i, values[i]) for i in heapq.nsmallest(k, range(n), key=lambda i: (-values[i], i))]

    async def pick(self, sampler: Sampler, previous: Sequence[int], generated: Sequence[int], row: int = 0) -> int:
        """The token ``sampler`` chooses from row ``row`` of the logits of the last forward after ``previous``
        (``generated`` this reply's part; :class:`~kvckpt_web.model.shortlist.Shortlist`)."""
        self._check_open("pick")
        return await self._shortlist.pick(self.logits, sampler, previous, generated, row)

    async def logprobs(self, token: int, top: int, row: int = 0) -> TokenLogprob:
        """The log probabilities of ``token`` and of the ``top`` most likely tokens in row ``row`` of the last
        forward."""
        self._check_open("logprobs")
        return await self._shortlist.logprobs(self.logits, token, top, row)

    async def _read(self, commands: list[Command], src: Buffer, offset: int, size: int) -> memoryview:
        """Run ``commands``, then read back ``size`` bytes of ``src`` from ``offset``."""
        self.device.submit(commands + [Copy(src, offset, self._readback, 0, size)])
        return await self.device.read(self._readback, 0, size)


def _f32(bits: int) -> float:
    return struct.unpack("<f", struct.pack("<I", bits))[0]


class GPULogits:
    """The logits of one run of a model's last forward, row ``row`` of its ``logits`` buffer; valid until its next
    forward."""

    def __init__(self, model: LlamaModel, forward: int, row: int) -> None:
        self._model = model
        self._forward = forward
        self._row = row

    async def argmax(self) -> int:
        """The id of the largest logit (ties: the lowest id), found on the GPU."""
        return (await self.top_k(1))[0][0]

    async def top_k(self, k: int) -> list[tuple[int, float]]:
        """The ``k`` largest logits as (token id, logit), largest first, ties lower id first."""
        self._check_current()
        return await self._model.top_k(k, self._row)

    async def pick(self, sampler: Sampler, previous: Sequence[int], generated: Sequence[int]) -> int:
        """The token ``sampler`` chooses from these logits after ``previous`` (``generated`` this reply's part),
        on the GPU."""
        self._check_current()
        return await self._model.pick(sampler, previous, generated, self._row)

    async def logprobs(self, token: int, top: int) -> TokenLogprob:
        """The log probability of ``token`` and of the ``top`` most likely tokens (log-softmax on the GPU)."""
        self._check_current()
        if isinstance(token, bool) or not isinstance(token, int) or not 0 <= token < self._model.vocab_size:
            raise FieldError("token", f"a token id in [0, {self._model.vocab_size})", token)
        if isinstance(top, bool) or not isinstance(top, int) or not 0 <= top <= MAX_TOP_LOGPROBS:
            raise FieldError("top", f"an integer in [0, {MAX_TOP_LOGPROBS}]", top)
        return await self._model.logprobs(token, top, self._row)

    def _check_current(self) -> None:
        if self._model.forwards != self._forward:
            raise CheckpointStateError(f"logits: expected those of the model's last forward ({self._model.forwards}), "
                                       f"got those of forward {self._forward}")
