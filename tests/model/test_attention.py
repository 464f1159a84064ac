"""RoPE, the float16 K/V write and paged attention (kvckpt_web.model.attention) against numpy float64.

Tolerances, from float32 arithmetic (unit roundoff u = 2^-24 ~ 6e-8) on inputs of size ~1:
- attention: each output is a softmax-weighted mean of float16 V values that the kernel reads exactly; the
  error comes from the float32 dot products (head_dim terms), exp and the running sums over at most ~1000 keys
  (in key ranges merged in a fixed order), a few hundred u at worst: ATTENTION_ATOL = 2e-5 (measured: below
  1e-6). With RoPE on, the float64 expectation is computed from the K/V the cache holds and the Q the kernel
  rotated: a K that float16 rounds one way on the device and the other in numpy moves a score by ~1e-3 and an
  output by up to ~5e-4, which is RoPE's error (tested on its own below), not the attention kernel's.
- RoPE: the angle position * rate is rounded to float32, an error up to ~u * angle (u * 5000 ~ 3e-4 rad at
  position 5000, as in Hugging Face's and TVM's float32 RoPE), plus cos/sin and rounding (~1e-6):
  rope_atol(position) = (2 * u * position + 4e-6) * |x|max.
- K in the cache: float16 of the kernel's rotated K, which is within rope_atol of the float64 rotation, so
  it equals numpy's float16 rounding of the float64 rotation or a float16 neighbour (1 ulp) where the two
  straddle a rounding boundary. V is copied: exactly numpy's float16 rounding.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from kvckpt_web import CacheLimits, CheckpointStateError, FieldError, KVLayout, PagedKVCache, TensorError
from kvckpt_web.gpu.device import Copy, Device, Usage
from kvckpt_web.model import kernels
from kvckpt_web.model.attention import PagedAttention

from kernel_io import run_texture
from reference import as_cached, causal_attention, rope

ATTENTION_ATOL = 2e-5
F32_U = 2.0 ** -24


def rope_atol(max_position: int, x: np.ndarray) -> float:
    """The RoPE tolerance at positions up to ``max_position`` for values ``x`` (see the module docstring)."""
    return (2 * F32_U * max_position + 4e-6) * float(np.abs(x).max())


class Harness:
    """A cache, its PagedAttention, and the float64 K/V each sequence should hold (rotated, float16-rounded)."""

    def __init__(self, device: Device, *, page_size: int = 16, num_qo_heads: int = 6, num_kv_heads: int = 2,
                 head_dim: int = 8, rope_mode: str = "none", theta: float = 10000.0, max_len: int = 256,
                 seed: int = 0, **attention_options: int) -> None:
        self.device = device
        self.layout = KVLayout(page_size=page_size, num_layers=2, num_qo_heads=num_qo_heads,
                               num_kv_heads=num_kv_heads, qk_head_dim=head_dim, rope_mode=rope_mode,
                               rotary_theta=theta)
        self.cache = PagedKVCache(device, self.layout, CacheLimits(4, max_len, max_len), transfer="kernel")
        self.attention = PagedAttention(self.cache, **attention_options)
        self.rng = np.random.default_rng(seed)
        self.kv: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self._buffers: list = []

    def close(self) -> None:
        for buf in self._buffers:
            self.device.destroy(buf)
        self.attention.close()
        self.cache.close()

    def add(self, seq_id: int) -> None:
        self.cache.add_sequence(seq_id)
        shape = (0, self.layout.num_kv_heads, self.layout.head_dim)
        self.kv[seq_id] = (np.zeros(shape), np.zeros(shape))

    def fork(self, parent: int, child: int, pos: int) -> None:
        self.cache.fork_sequence(parent, child, pos)
        k, v = self.kv[parent]
        self.kv[child] = (k[:pos], v[:pos])

    def random_qkv(self, num_tokens: int) -> np.ndarray:
        lay = self.layout
        heads = lay.num_qo_heads + 2 * lay.num_kv_heads
        return self.rng.standard_normal((num_tokens, heads, lay.head_dim)).astype(np.float32)

    def buffer(self, nbytes: int, usage: Usage) -> object:
        buf = self.device.create_buffer(nbytes, usage, "test.attention")
        self._buffers.append(buf)
        return buf

    def _read(self, buf, nbytes: int) -> bytes:
        staging = self.buffer(nbytes, Usage.MAP_READ | Usage.COPY_DST)
        self.device.submit([Copy(buf, 0, staging, 0, nbytes)])

        async def read() -> bytes:
            return bytes(await self.device.read(staging, 0, nbytes))

        return asyncio.run(read())

    def forward(self, lengths: dict[int, int], layer: int = 0, qkv: np.ndarray | None = None
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """One forward over ``layer``: (qkv given, qkv after the kernels (Q rotated), attention output)."""
        lay = self.layout
        self.cache.begin_forward(list(lengths), list(lengths.values()))
        n = sum(lengths.values())
        qkv = self.random_qkv(n) if qkv is None else qkv
        qkv_buf = self.buffer(qkv.nbytes, Usage.STORAGE | Usage.COPY_DST | Usage.COPY_SRC)
        self.device.write(qkv_buf, 0, qkv.tobytes())
        out_tex = kernels.activation_texture(self.device, lay.num_qo_heads * lay.head_dim, n, "test.attention.out")
        self._buffers.append(out_tex)
        out = run_texture(self.device, [self.attention.rope_append(layer, qkv_buf),
                                        *self.attention.attend(layer, qkv_buf, out_tex)], out_tex)
        out = out.reshape(n, lay.num_qo_heads, lay.head_dim)
        rotated = np.frombuffer(self._read(qkv_buf, qkv.nbytes), np.float32).reshape(qkv.shape)
        self.cache.end_forward()
        return qkv, rotated, out

    def expected(self, lengths: dict[int, int], qkv: np.ndarray, layer: int = 0) -> np.ndarray:
        """The float64 attention output of a forward of ``qkv`` over ``layer``; records the sequences' new K/V."""
        lay = self.layout
        nq, nkv = lay.num_qo_heads, lay.num_kv_heads
        out, token = [], 0
        for seq_id, n in lengths.items():
            k_all, v_all = self.kv[seq_id]
            positions = np.arange(len(k_all), len(k_all) + n)
            rows = qkv[token:token + n].astype(np.float64)
            q, k, v = rows[:, :nq], rows[:, nq:nq + nkv], rows[:, nq + nkv:]
            if lay.rope_mode == "normal":
                q, k = rope(q, positions, lay.rotary_theta), rope(k, positions, lay.rotary_theta)
            k_all, v_all = np.concatenate([k_all, as_cached(k)]), np.concatenate([v_all, as_cached(v)])
            self.kv[seq_id] = (k_all, v_all)
            out.append(causal_attention(q, k_all, v_all, positions, self.attention.windows[layer]))
            token += n
        return np.concatenate(out)

    def check(self, lengths: dict[int, int], layer: int = 0) -> np.ndarray:
        """Run a forward and assert its output matches float64 within ATTENTION_ATOL; return the output."""
        qkv, _, out = self.forward(lengths, layer)
        np.testing.assert_allclose(out, self.expected(lengths, qkv, layer), rtol=0, atol=ATTENTION_ATOL)
        return out


@pytest.fixture
def harness(device):
    made: list[Harness] = []

    def make(**kwargs) -> Harness:
        made.append(Harness(device, **kwargs))
        return made[-1]

    yield make
    for h in made:
        h.close()


def contiguous(table: list[int]) -> bool:
    return all(b == a + 1 for a, b in zip(table, table[1:]))


# ----- attention -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("num_qo_heads,num_kv_heads", [(2, 2), (6, 2)])
def test_chunked_prefill_across_pages_then_decode_matches_float64(harness, page_size, num_qo_heads, num_kv_heads):
    h = harness(page_size=page_size, num_qo_heads=num_qo_heads, num_kv_heads=num_kv_heads)
    h.add(0)
    for chunk in (5, 13, 17, 1, 1, 1):  # odd lengths; chunks 2 and 3 cross page boundaries of 16-token pages
        h.check({0: chunk})


@pytest.mark.parametrize("rows_per_tile,keys_per_split", [(1, 1), (1, 5), (4, 7), (2, 16), (8, 64)])
def test_tiles_and_key_splits_of_any_size_match_float64(harness, rows_per_tile, keys_per_split):
    h = harness(page_size=4, rows_per_tile=rows_per_tile, keys_per_split=keys_per_split)
    for seq in (0, 1):
        h.add(seq)
    h.check({0: 11, 1: 3})  # tiles end mid-sequence; sequence 1's tokens share no tile with sequence 0's
    h.check({1: 9, 0: 1})
    h.check({0: 1, 1: 1})


def test_decode_after_a_thousand_tokens_matches_float64(harness):
    # a kernel looping over head_dim per key (head_dim 64) ran past llvmpipe's 65535 loop iterations at ~1000 keys
    h = harness(num_qo_heads=9, num_kv_heads=3, head_dim=64, max_len=1100)
    h.add(0)
    h.check({0: 1040})
    h.check({0: 1})


def test_one_prefill_of_a_whole_prompt_matches_float64(harness):
    h = harness(num_qo_heads=9, num_kv_heads=3, head_dim=64)
    h.add(0)
    h.check({0: 37})


@pytest.mark.parametrize("keys_per_split", [None, 3, 16])
def test_a_sliding_window_layer_attends_to_its_last_keys_only(harness, keys_per_split):
    # a window of 7 over pages of 4, key ranges shorter and longer than it; layer 1 sees every key
    h = harness(page_size=4, windows=[7, 0], **({} if keys_per_split is None else {"keys_per_split": keys_per_split}))
    h.add(0)
    for chunk in (5, 13, 1, 1):
        h.check({0: chunk})
    h.add(1)
    h.check({1: 20}, layer=1)


def test_heads_of_256_as_gemma3s_match_float64(harness):
    h = harness(num_qo_heads=4, num_kv_heads=1, head_dim=256)
    h.add(0)
    h.check({0: 37})
    h.check({0: 1})


def test_fragmented_page_table_is_followed(harness):
    h = harness(page_size=1, max_len=24)  # 25 pages: the sequences soon run into each other
    for seq in (0, 1, 2):
        h.add(seq)
    for _ in range(3):
        h.check({0: 2, 1: 2, 2: 2})
    h.cache.remove_sequence(1)
    h.check({0: 5, 2: 3})
    assert not contiguous(h.cache.page_table(0))
    h.check({0: 1, 2: 1})


@pytest.mark.parametrize("fork_pos", [16, 20])
def test_forked_sequences_read_their_shared_pages(harness, fork_pos):
    h = harness(page_size=16)
    h.add(0)
    h.check({0: 24})
    h.fork(0, 1, fork_pos)
    assert h.cache.page_table(1)[0] == h.cache.page_table(0)[0]
    h.check({1: 3, 0: 2})  # both in one forward, the child first
    h.check({0: 1, 1: 1})


def test_attention_reads_the_layer_it_is_given(harness):
    h = harness()
    h.add(0)
    h.check({0: 4}, layer=1)
    h.kv[0] = (h.kv[0][0][:0], h.kv[0][1][:0])  # layer 0 of this sequence holds only what comes next
    h.cache.popn(0, 4)
    h.check({0: 4}, layer=0)


def test_same_inputs_give_the_same_bits(harness):
    runs = []
    for _ in range(2):
        h = harness(num_qo_heads=9, num_kv_heads=3, head_dim=64, rope_mode="normal", seed=7)
        h.add(0)
        _, rotated, out = h.forward({0: 21})
        _, rotated2, out2 = h.forward({0: 1})
        k, v = asyncio.run(h.cache.debug_get_kv(0, 0, 22))
        runs.append((rotated.tobytes(), out.tobytes(), rotated2.tobytes(), out2.tobytes(), k.data, v.data))
    assert runs[0] == runs[1]


# ----- RoPE and the K/V write --------------------------------------------------------------------------------


def test_rope_rotates_q_like_float64_at_large_positions(harness):
    h = harness(num_qo_heads=9, num_kv_heads=3, head_dim=64, rope_mode="normal", theta=100000.0, max_len=5120)
    h.add(0)
    h.cache.begin_forward([0], [5000])  # positions 0..4999 reserved, never read
    h.cache.end_forward()
    qkv, rotated, _ = h.forward({0: 7})
    positions = np.arange(5000, 5007)
    expected = rope(qkv[:, :9], positions, 100000.0)
    np.testing.assert_allclose(rotated[:, :9], expected, rtol=0, atol=rope_atol(5006, qkv[:, :9]))
    np.testing.assert_array_equal(rotated[:, 9:], qkv[:, 9:])  # K and V are read, not changed


def test_rope_at_position_zero_leaves_q_unchanged(harness):
    h = harness(rope_mode="normal")
    h.add(0)
    qkv, rotated, _ = h.forward({0: 1})
    np.testing.assert_array_equal(rotated, qkv)


def test_cache_holds_float16_of_rotated_k_and_of_v(harness):
    h = harness(num_qo_heads=9, num_kv_heads=3, head_dim=64, rope_mode="normal", theta=100000.0, max_len=512)
    h.add(0)
    qkv, _, _ = h.forward({0: 300})
    k, v = asyncio.run(h.cache.debug_get_kv(0, 0, 300))
    k = np.frombuffer(k.data, np.float16).reshape(k.shape)[0]
    v = np.frombuffer(v.data, np.float16).reshape(v.shape)[0]
    np.testing.assert_array_equal(v, qkv[:, 12:].astype(np.float16))
    exact = rope(qkv[:, 9:12], np.arange(300), 100000.0)
    # float16 of a value within rope_atol of the exact rotation: within that plus half a float16 spacing
    spacing = np.spacing(np.maximum(np.abs(k), np.abs(exact)).astype(np.float16)).astype(np.float64)
    np.testing.assert_array_less(np.abs(k - exact), rope_atol(299, qkv[:, 9:12]) + spacing / 2)
    assert (k == exact.astype(np.float16)).mean() > 0.99


def test_attention_after_rope_matches_float64_over_the_cached_k_v(harness):
    h = harness(num_qo_heads=9, num_kv_heads=3, head_dim=64, rope_mode="normal", theta=100000.0)
    h.add(0)
    start = 0
    for chunk in (45, 1, 1):
        _, rotated, out = h.forward({0: chunk})
        k, v = asyncio.run(h.cache.debug_get_kv(0, 0, start + chunk))
        k = np.frombuffer(k.data, np.float16).reshape(k.shape)[0]
        v = np.frombuffer(v.data, np.float16).reshape(v.shape)[0]
        expected = causal_attention(rotated[:, :9], k, v, np.arange(start, start + chunk))
        np.testing.assert_allclose(out, expected, rtol=0, atol=ATTENTION_ATOL)
        start += chunk


# ----- refusals ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("field,overrides", [
    ("layout.dtype", dict(dtype="float32")),
    ("layout.qk_head_dim", dict(qk_head_dim=7)),
    ("layout.qk_head_dim", dict(qk_head_dim=12)),
    ("layout.qk_head_dim", dict(qk_head_dim=264)),
    ("layout.rope_mode", dict(rope_mode="inline")),
])
def test_a_layout_the_kernels_cannot_serve_is_refused(device, field, overrides):
    layout = KVLayout(**{**dict(page_size=4, num_layers=1, num_qo_heads=4, num_kv_heads=2, qk_head_dim=8), **overrides})
    cache = PagedKVCache(device, layout, CacheLimits(1, 16, 16))
    try:
        with pytest.raises(FieldError, match=field):
            PagedAttention(cache)
    finally:
        cache.close()


@pytest.mark.parametrize("field,options", [
    ("rows_per_tile", dict(rows_per_tile=0)),
    ("rows_per_tile", dict(rows_per_tile=9)),
    ("rows_per_tile", dict(rows_per_tile=True)),  # more than MAX_ROWS_PER_TILE
    ("keys_per_split", dict(keys_per_split=0)),
    ("keys_per_split", dict(keys_per_split=100_000)),
])
def test_tiles_and_splits_the_kernel_cannot_serve_are_refused(device, field, options):
    layout = KVLayout(page_size=4, num_layers=1, num_qo_heads=2, num_kv_heads=2, qk_head_dim=8)
    cache = PagedKVCache(device, layout, CacheLimits(1, 16, 16))
    try:
        with pytest.raises(FieldError, match=field):
            PagedAttention(cache, **options)
    finally:
        cache.close()


def test_dispatches_without_a_forward_are_refused(harness):
    h = harness()
    buf = h.buffer(1024, Usage.STORAGE)
    with pytest.raises(CheckpointStateError, match="begin_forward"):
        h.attention.rope_append(0, buf)


def test_a_qkv_buffer_too_small_for_the_forward_is_refused(harness):
    h = harness()
    h.add(0)
    h.cache.begin_forward([0], [3])
    small = h.buffer(h.attention.qkv_bytes_per_token * 2, Usage.STORAGE)
    with pytest.raises(TensorError, match="qkv.size"):
        h.attention.rope_append(0, small)


def test_a_layer_outside_the_cache_is_refused(harness):
    h = harness()
    h.add(0)
    h.cache.begin_forward([0], [1])
    buf = h.buffer(h.attention.qkv_bytes_per_token, Usage.STORAGE)
    with pytest.raises(TensorError, match="layer"):
        h.attention.rope_append(2, buf)
