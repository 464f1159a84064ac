"""Self-tests of the TVM reference harness (``tests/support/tvm_reference.py``).

These drive Apache TVM's real PagedAttentionKVCache on CPU. They are skipped
only when ``import tvm`` fails; CI installs TVM, so there they always run.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

tvm = pytest.importorskip("tvm", reason="Apache TVM is not installed (CI installs it)")

from support import tvm_reference as ref


def _random_kv(cache: ref.TVMCache, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    shape = (cache.num_layers, n, cache.num_kv_heads, cache.head_dim)
    return (
        rng.standard_normal(shape).astype(cache.dtype),
        rng.standard_normal(shape).astype(cache.dtype),
    )


def _small_cache(**overrides) -> ref.TVMCache:
    config = dict(page_size=4, num_layers=2, num_qo_heads=4, num_kv_heads=2, head_dim=32)
    config.update(overrides)
    return ref.TVMCache(**config)


def _tokens_from_pages(group: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """K and V rows (n, H, D) of an exported group (1, pages, 2, H, page_size, D)."""
    _, pages, _, heads, page_size, dim = group.shape
    kv = group[0].transpose(1, 0, 3, 2, 4).reshape(2, pages * page_size, heads, dim)
    return kv[0, :n], kv[1, :n]


def test_tvm_available_reports_true_when_tvm_imports():
    assert ref.tvm_available()


@pytest.mark.parametrize(
    "config",
    [
        dict(rope_mode=ref.ROPE_NONE, dtype="float16", page_size=16, num_qo_heads=8,
             num_kv_heads=2, head_dim=64),
        dict(rope_mode=ref.ROPE_INLINE, dtype="float32", page_size=1, num_qo_heads=4,
             num_kv_heads=4, head_dim=32, layer_begin=2, rotary_scale=0.5, rotary_theta=500000.5),
        dict(rope_mode=ref.ROPE_NONE, dtype="float16", page_size=8, num_qo_heads=4,
             num_kv_heads=2, head_dim=128, layer_begin=1),
    ],
    ids=["none-f16-gqa", "inline-f32-page1-layer_begin", "none-f16-d128"],
)
def test_appended_kv_reads_back_unchanged_without_normal_rope(config):
    cache = _small_cache(**config)
    cache.add_sequence(0)
    cache.add_sequence(1)
    k0, v0 = _random_kv(cache, 19, seed=0)
    k1, v1 = _random_kv(cache, 3, seed=1)
    cache.append([0, 1], {0: (k0, v0), 1: (k1, v1)})
    k_decode, v_decode = _random_kv(cache, 1, seed=2)
    cache.append_seq(0, k_decode, v_decode)

    k, v = cache.debug_get_kv(0, 0, 20)
    np.testing.assert_array_equal(k, np.concatenate([k0, k_decode], axis=1))
    np.testing.assert_array_equal(v, np.concatenate([v0, v_decode], axis=1))
    k, v = cache.debug_get_kv(1, 0, 3)
    np.testing.assert_array_equal(k, k1)
    np.testing.assert_array_equal(v, v1)


@pytest.mark.parametrize("dtype, atol", [("float16", 1e-2), ("float32", 1e-5)])
def test_normal_rope_stores_rotated_k_and_unchanged_v(dtype, atol):
    cache = _small_cache(dtype=dtype, rope_mode=ref.ROPE_NORMAL, rotary_scale=0.25,
                         rotary_theta=12345.5)
    cache.add_sequence(0)
    k_first, v_first = _random_kv(cache, 6, seed=3)
    k_next, v_next = _random_kv(cache, 5, seed=4)
    cache.append_seq(0, k_first, v_first)
    cache.append_seq(0, k_next, v_next)

    k, v = cache.debug_get_kv(0, 0, 11)
    np.testing.assert_array_equal(v, np.concatenate([v_first, v_next], axis=1))
    expected_k = np.concatenate(
        [cache.expected_stored_k(k_first, 0), cache.expected_stored_k(k_next, 6)], axis=1
    )
    np.testing.assert_allclose(k.astype(np.float64), expected_k.astype(np.float64), atol=atol, rtol=0)
    assert not np.array_equal(k[:, 1:], np.concatenate([k_first, k_next], axis=1)[:, 1:])
    np.testing.assert_array_equal(k[:, 0], k_first[:, 0])  # position 0 is not rotated


def test_export_of_page_size_plus_one_tokens_has_zero_tail():
    cache = _small_cache(page_size=8)
    cache.add_sequence(0)
    cache.append_seq(0, *_random_kv(cache, 16, seed=5))
    cache.popn(0, 7)  # keeps both pages; slots 1..7 of page 1 still hold stale K/V
    assert cache.get_sequence_length(0) == 9
    k_stored, v_stored = cache.debug_get_kv(0, 0, 9)

    metadata = json.loads(cache.get_checkpoint_metadata(0))
    groups = cache.export_groups(0)
    for layer in range(cache.num_layers):
        group = cache.export_page_group(0, layer)
        assert group.shape == (1, 2, 2, cache.num_kv_heads, 8, cache.head_dim)
        assert len(groups[layer]) == metadata["groups"][layer]["nbytes"] == group.nbytes
        assert groups[layer] == group.tobytes()
        assert not group[0, 1, :, :, 1:].any(), "slots after the last token must be zero"
        k, v = _tokens_from_pages(group, 9)
        np.testing.assert_array_equal(k, k_stored[layer])
        np.testing.assert_array_equal(v, v_stored[layer])


def test_export_import_export_is_byte_identical():
    source = _small_cache(rope_mode=ref.ROPE_NORMAL, rotary_scale=0.1, layer_begin=3)
    source.add_sequence(0)
    source.append_seq(0, *_random_kv(source, 10, seed=6))
    metadata = source.get_checkpoint_metadata(0)
    groups = source.export_groups(0)

    target = _small_cache(rope_mode=ref.ROPE_NORMAL, rotary_scale=0.1, layer_begin=3)
    target.import_checkpoint(metadata, groups)

    assert target.get_sequence_length(0) == 10
    assert target.get_checkpoint_metadata(0) == metadata
    assert target.export_groups(0) == groups
    for expected, actual in zip(source.debug_get_kv(0, 0, 10), target.debug_get_kv(0, 0, 10)):
        np.testing.assert_array_equal(actual, expected)


def test_fork_in_middle_of_page_then_export_matches_parent_prefix():
    cache = _small_cache(page_size=4)
    cache.add_sequence(1)
    cache.append_seq(1, *_random_kv(cache, 11, seed=7))
    parent_k, parent_v = cache.debug_get_kv(1, 0, 11)

    cache.fork_sequence(1, 0, fork_pos=6)  # page 1, offset 2: copied into a fresh page

    assert cache.get_sequence_length(0) == 6
    for layer, group in enumerate(cache.export_groups(0)):
        pages = np.frombuffer(group, dtype=cache.np_dtype).reshape(
            1, 2, 2, cache.num_kv_heads, 4, cache.head_dim
        )
        assert not pages[0, 1, :, :, 2:].any()
        k, v = _tokens_from_pages(pages, 6)
        np.testing.assert_array_equal(k, parent_k[layer, :6])
        np.testing.assert_array_equal(v, parent_v[layer, :6])
    k_after, v_after = cache.debug_get_kv(1, 0, 11)
    np.testing.assert_array_equal(k_after, parent_k)
    np.testing.assert_array_equal(v_after, parent_v)


def test_tvm_errors_propagate_as_internal_error():
    cache = _small_cache()
    cache.add_sequence(1)
    with pytest.raises(tvm.error.InternalError, match="only supports sequence id 0"):
        cache.export_page_group(1, 0)


def test_second_identical_cache_reuses_compiled_kernels():
    _small_cache(page_size=2, head_dim=48)
    misses = ref.compiled_kernel.cache_info().misses
    _small_cache(page_size=2, head_dim=48)
    assert ref.compiled_kernel.cache_info().misses == misses
