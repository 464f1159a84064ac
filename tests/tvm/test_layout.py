"""KVLayout: TVM's layout hash and descriptor, checkpointability, and constructor validation.

The golden hashes were produced once by Apache TVM 0.27
(``vm.builtin.attention_kv_cache_get_layout_hash`` on a cache created with the same
parameters); they are hard-coded so these tests need neither TVM nor a GPU.
"""

from __future__ import annotations

import json
import math

import pytest

from kvckpt_web import CacheLimits, FieldError, KVLayout, PagedKVCache, UnsupportedLayoutError
from kvckpt_web.tvm.layout import cpp_double, fnv1a64
from kvckpt_web.tvm.metadata import layout_from_metadata, write_metadata

#: TVM's create_kv_cache defaults in its checkpoint tests.
TVM_TEST_LAYOUT = dict(page_size=16, num_layers=4, num_qo_heads=32, num_kv_heads=4, qk_head_dim=64)

#: (layout kwargs, TVM 0.27's layout hash for them).
GOLDEN_HASHES = {
    "f16-rope_none-gqa": (dict(page_size=4, num_layers=2, num_qo_heads=4, num_kv_heads=2, qk_head_dim=8,
                               rope_mode="none"), "3e52f28ab5c525dd"),
    "tvm-test-defaults": (TVM_TEST_LAYOUT, "e08c859fb40ae6ec"),
    "f32-inline-page1-layer_begin2": (dict(page_size=1, num_layers=2, num_qo_heads=4, num_kv_heads=4,
                                           qk_head_dim=32, dtype="float32", layer_begin=2, rope_mode="inline",
                                           rotary_scale=0.5, rotary_theta=500000.5), "929c11f91cbae4ac"),
    "bf16-scale0.1-theta1e16": (dict(page_size=8, num_layers=1, num_qo_heads=2, num_kv_heads=1, qk_head_dim=16,
                                     dtype="bfloat16", rotary_scale=0.1, rotary_theta=1e16), "9ef04b0f40f20772"),
    "f16-odd_head_dim-theta1e17": (dict(page_size=4, num_layers=1, num_qo_heads=2, num_kv_heads=2, qk_head_dim=33,
                                        rotary_theta=1e17), "2f20a3222ed3e588"),
}

GOLDEN_DESCRIPTOR = (
    "format_version=1;cache_type=relax.vm.PagedAttentionKVCache;page_size=4;num_layers=2;layer_begin=0;"
    "layer_end=2;num_qo_heads=4;num_kv_heads=2;qk_head_dim=8;v_head_dim=8;dtype=float16;rope_mode=none;"
    "rotary_scale=1;rotary_theta=10000;has_rope_ext_factors=0;support_sliding_window=0;"
    "support_layer_sliding_window=0;page_group_layout=1,num_logical_pages,2,num_kv_heads,page_size,qk_head_dim;"
    "attn_kinds=mha,mha"
)


def base() -> KVLayout:
    return KVLayout(**TVM_TEST_LAYOUT)


# ----- the hash ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", GOLDEN_HASHES)
def test_layout_hash_matches_tvm_golden(name):
    kwargs, expected = GOLDEN_HASHES[name]
    assert KVLayout(**kwargs).layout_hash() == expected


def test_layout_hash_is_16_lowercase_hex_digits():
    h = base().layout_hash()
    assert len(h) == 16 and set(h) <= set("0123456789abcdef")


def test_layout_hash_is_stable_for_equal_layouts():
    assert base().layout_hash() == base().layout_hash() == KVLayout(**TVM_TEST_LAYOUT).layout_hash()


def test_explicit_defaults_hash_like_implicit_ones():
    explicit = KVLayout(**TVM_TEST_LAYOUT, dtype="float16", layer_begin=0, layer_end=4, v_head_dim=64,
                        attn_kinds=("mha",) * 4, rope_mode="normal", rotary_scale=1, rotary_theta=10000)
    assert explicit.layout_hash() == base().layout_hash()


LAYOUT_CHANGES = {
    "page_size": dict(page_size=32),
    "num_layers": dict(num_layers=2),
    "head_dim": dict(qk_head_dim=128),
    "num_qo_heads": dict(num_qo_heads=16),
    "num_kv_heads": dict(num_kv_heads=8),
    "dtype_float32": dict(dtype="float32"),
    "dtype_bfloat16": dict(dtype="bfloat16"),
    "rope_none": dict(rope_mode="none"),
    "rope_inline": dict(rope_mode="inline"),
    "layer_begin": dict(layer_begin=1),
    "rotary_scale": dict(rotary_scale=0.5),
    "rotary_theta": dict(rotary_theta=500000.0),
    "rotary_theta_last_bit": dict(rotary_theta=10000.000000000002),
}


@pytest.mark.parametrize("change", LAYOUT_CHANGES)
def test_layout_hash_changes_with_each_layout_field(change):
    changed = KVLayout(**{**TVM_TEST_LAYOUT, **LAYOUT_CHANGES[change]})
    assert changed.layout_hash() != base().layout_hash()


def test_layout_hashes_of_different_layouts_are_all_distinct():
    hashes = [KVLayout(**{**TVM_TEST_LAYOUT, **c}).layout_hash() for c in LAYOUT_CHANGES.values()]
    assert len(set(hashes)) == len(hashes)


def test_descriptor_lists_attn_kinds_per_layer():
    mixed = KVLayout(**{**TVM_TEST_LAYOUT, "num_layers": 2, "attn_kinds": ("mha", "mla")})
    assert mixed.descriptor().endswith(";attn_kinds=mha,mla")
    assert mixed.descriptor() != KVLayout(**{**TVM_TEST_LAYOUT, "num_layers": 2}).descriptor()


def test_layout_hash_is_blind_to_operational_limits():
    layout = base()
    small = CacheLimits(reserved_num_seqs=4, max_total_seq_len=128, prefill_chunk_size=64)
    large = CacheLimits(reserved_num_seqs=8, max_total_seq_len=256, prefill_chunk_size=32)
    a, b = (json.loads(write_metadata(layout, limits, 0, 17)) for limits in (small, large))
    assert a["layout_hash"] == b["layout_hash"] == layout.layout_hash()
    assert (a["reserved_num_seqs"], a["num_total_pages"]) != (b["reserved_num_seqs"], b["num_total_pages"])


def test_caches_with_different_limits_report_the_same_layout_hash(device):
    layout = KVLayout(page_size=4, num_layers=1, num_qo_heads=2, num_kv_heads=1, qk_head_dim=8)
    a = PagedKVCache(device, layout, CacheLimits(2, 16, 8))
    b = PagedKVCache(device, layout, CacheLimits(8, 64, 32))
    try:
        assert a.get_layout_hash() == b.get_layout_hash() == layout.layout_hash()
    finally:
        a.close()
        b.close()


# ----- the descriptor ----------------------------------------------------------------------------------


def test_descriptor_matches_golden_text():
    assert KVLayout(**GOLDEN_HASHES["f16-rope_none-gqa"][0]).descriptor() == GOLDEN_DESCRIPTOR


def test_layout_hash_is_fnv1a64_of_the_descriptor():
    assert "%016x" % fnv1a64(GOLDEN_DESCRIPTOR.encode()) == GOLDEN_HASHES["f16-rope_none-gqa"][1]


def test_descriptor_prints_doubles_as_cpp_setprecision_17():
    text = KVLayout(**GOLDEN_HASHES["bf16-scale0.1-theta1e16"][0]).descriptor()
    assert ";rotary_scale=0.10000000000000001;rotary_theta=10000000000000000;" in text


@pytest.mark.parametrize("data, expected", [(b"", 0xCBF29CE484222325), (b"a", 0xAF63DC4C8601EC8C),
                                            (b"foobar", 0x85944171F73967E8)])
def test_fnv1a64_matches_reference_vectors(data, expected):
    assert fnv1a64(data) == expected


@pytest.mark.parametrize("value, text", [(1.0, "1"), (10000.0, "10000"), (0.5, "0.5"), (0.1, "0.10000000000000001"),
                                         (1e16, "10000000000000000"), (1e17, "1e+17"), (500000.5, "500000.5")])
def test_cpp_double_formats_like_ostream_precision_17(value, text):
    assert cpp_double(value) == text


# ----- derived sizes -----------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype, elem", [("float16", 2), ("bfloat16", 2), ("float32", 4)])
def test_page_bytes_cover_k_and_v_of_every_head_and_slot(dtype, elem):
    layout = KVLayout(page_size=4, num_layers=3, num_qo_heads=6, num_kv_heads=3, qk_head_dim=10, dtype=dtype)
    assert layout.page_bytes == 2 * 3 * 4 * 10 * elem


def test_group_shape_is_tvm_page_group_layout():
    assert base().group_shape(3) == (1, 3, 2, 4, 16, 64)


@pytest.mark.parametrize("length, pages", [(0, 0), (1, 1), (15, 1), (16, 1), (17, 2), (48, 3)])
def test_num_logical_pages_rounds_up(length, pages):
    assert base().num_logical_pages(length) == pages


@pytest.mark.parametrize("max_len, pages", [(0, 1), (1, 2), (16, 2), (17, 3), (128, 9)])
def test_num_total_pages_is_ceil_max_over_page_plus_one(max_len, pages):
    assert CacheLimits(max_total_seq_len=max_len).num_total_pages(16) == pages


def test_layer_end_defaults_to_layer_begin_plus_num_layers():
    assert KVLayout(**{**TVM_TEST_LAYOUT, "layer_begin": 3}).layer_end == 7


def test_kv_transfer_is_not_part_of_layout_equality():
    assert KVLayout(**TVM_TEST_LAYOUT, kv_transfer=True) == base()


@pytest.mark.parametrize("name", GOLDEN_HASHES)
def test_from_metadata_rebuilds_the_layout(name):
    layout = KVLayout(**GOLDEN_HASHES[name][0])
    metadata = json.loads(write_metadata(layout, CacheLimits(), 0, 3))
    assert layout_from_metadata(metadata) == layout


# ----- unsupported layouts -----------------------------------------------------------------------------

UNSUPPORTED = {
    "mla": (dict(num_layers=2, attn_kinds=("mha", "mla")), "full-context MHA/GQA"),
    "linear": (dict(num_layers=2, attn_kinds=("linear", "mha")), "full-context MHA/GQA"),
    "mha_sliding": (dict(num_layers=2, attn_kinds=("mha_sliding", "mha_sliding")), "full-context MHA/GQA"),
    "v_head_dim": (dict(v_head_dim=32), "qk_head_dim to equal v_head_dim"),
    "sliding_window": (dict(support_sliding_window=True), "sliding-window"),
    "layer_sliding_window": (dict(support_layer_sliding_window=True), "sliding-window"),
    "rope_ext_factors": (dict(has_rope_ext_factors=True), "RoPE extension factors"),
    "kv_transfer": (dict(kv_transfer=True), "KV transfer"),
}


@pytest.mark.parametrize("name", UNSUPPORTED)
def test_unsupported_layout_refuses_a_layout_hash_with_tvms_reason(name):
    change, reason = UNSUPPORTED[name]
    layout = KVLayout(**{**TVM_TEST_LAYOUT, **change})  # constructing it is fine
    with pytest.raises(UnsupportedLayoutError, match=reason):
        layout.layout_hash()
    with pytest.raises(UnsupportedLayoutError, match=reason):
        layout.check_checkpointable()


@pytest.mark.parametrize("name", UNSUPPORTED)
def test_unsupported_layout_refuses_checkpoint_metadata(name):
    change, reason = UNSUPPORTED[name]
    with pytest.raises(UnsupportedLayoutError, match=reason):
        write_metadata(KVLayout(**{**TVM_TEST_LAYOUT, **change}), CacheLimits(), 0, 1)


def test_supported_layout_passes_the_checkpointable_check():
    base().check_checkpointable()  # does not raise


# ----- sliding-window layers (kvckpt's extension, FORMAT.md section 11) --------------------------------

SLIDING = dict(num_layers=4, attn_kinds=("mha_sliding", "mha_sliding", "mha_sliding", "mha"),
               support_layer_sliding_window=True, sliding_window=512, rotary_theta=1e6, sliding_rotary_theta=1e4)


def test_a_layout_whose_sliding_layers_have_a_window_is_checkpointable_here():
    KVLayout(**{**TVM_TEST_LAYOUT, **SLIDING}).check_checkpointable()  # does not raise


def test_tvm_refuses_the_checkpoints_of_a_layout_with_sliding_layers_naming_why():
    layout = KVLayout(**{**TVM_TEST_LAYOUT, **SLIDING})
    with pytest.raises(UnsupportedLayoutError, match="TVM's checkpoints .* do not support sliding-window .*512 tokens"):
        layout.check_tvm_checkpointable()


def test_a_layout_without_sliding_layers_is_one_tvm_takes():
    base().check_tvm_checkpointable()  # does not raise


def test_the_hash_of_a_sliding_layout_covers_its_window_and_its_rope_base():
    layout = KVLayout(**{**TVM_TEST_LAYOUT, **SLIDING})
    assert layout.descriptor().endswith(";sliding_window=512;sliding_rotary_theta=10000")
    hashes = {KVLayout(**{**TVM_TEST_LAYOUT, **SLIDING, **change}).layout_hash()
              for change in ({}, {"sliding_window": 256}, {"sliding_rotary_theta": 2e4}, {"sliding_rotary_theta": None})}
    assert len(hashes) == 4


def test_a_sliding_layouts_metadata_records_its_window_and_reads_back_as_the_same_layout():
    layout = KVLayout(**{**TVM_TEST_LAYOUT, **SLIDING})
    metadata = json.loads(write_metadata(layout, CacheLimits(), 0, 3))
    assert (metadata["sliding_window"], metadata["sliding_rotary_theta"]) == (512, 1e4)
    assert layout_from_metadata(metadata) == layout


def test_the_metadata_of_a_layout_without_sliding_layers_has_no_window_fields():
    assert "sliding_window" not in json.loads(write_metadata(base(), CacheLimits(), 0, 3))


BAD_SLIDING = [
    (dict(sliding_window=512), "layout.sliding_window", 512),  # no layer slides
    (dict(**{**SLIDING, "support_layer_sliding_window": False}), "layout.support_layer_sliding_window", False),
    (dict(**{**SLIDING, "sliding_window": -1}), "layout.sliding_window", -1),
    (dict(**{**SLIDING, "sliding_rotary_theta": math.inf}), "layout.sliding_rotary_theta", math.inf),
    (dict(**{**SLIDING, "sliding_rotary_theta": "1e4"}), "layout.sliding_rotary_theta", "str"),
    (dict(**{**SLIDING, "sliding_window": 0}), "layout.sliding_rotary_theta", 1e4),  # a base with no window
]


@pytest.mark.parametrize("change, field, got", BAD_SLIDING, ids=[f"{f}={g}" for _, f, g in BAD_SLIDING])
def test_window_fields_that_disagree_with_the_sliding_layers_are_refused_naming_the_field(change, field, got):
    with pytest.raises(FieldError) as info:
        KVLayout(**{**TVM_TEST_LAYOUT, **change})
    assert (info.value.field, info.value.got) == (field, got)


# ----- constructor validation --------------------------------------------------------------------------

PASSED = object()  # expected "got": the value passed
NAN = object()  # expected "got": nan
BAD_LAYOUT_VALUES = [
    (dict(page_size=0), "layout.page_size", PASSED),
    (dict(num_layers=-1), "layout.num_layers", PASSED),
    (dict(num_qo_heads=True), "layout.num_qo_heads", "bool"),
    (dict(num_kv_heads="4"), "layout.num_kv_heads", "str"),
    (dict(qk_head_dim=64.0), "layout.qk_head_dim", "float"),
    (dict(layer_begin=-1), "layout.layer_begin", PASSED),
    (dict(layer_end=5), "layout.layer_end", PASSED),
    (dict(v_head_dim=0), "layout.v_head_dim", PASSED),
    (dict(attn_kinds=("mha",) * 3), "layout.attn_kinds", 3),
    (dict(attn_kinds=("mha", "mha", "gqa", "mha")), "layout.attn_kinds[2]", "gqa"),
    (dict(dtype="int8"), "layout.dtype", PASSED),
    (dict(dtype="float64"), "layout.dtype", PASSED),
    (dict(rope_mode="yarn"), "layout.rope_mode", PASSED),
    (dict(rope_mode=1), "layout.rope_mode", "int"),
    (dict(rotary_scale="1.0"), "layout.rotary_scale", "str"),
    (dict(rotary_theta=None), "layout.rotary_theta", "NoneType"),
    (dict(rotary_theta=True), "layout.rotary_theta", "bool"),
    (dict(has_rope_ext_factors=1), "layout.has_rope_ext_factors", "int"),
    (dict(support_sliding_window="no"), "layout.support_sliding_window", "str"),
    (dict(support_layer_sliding_window=0), "layout.support_layer_sliding_window", "int"),
    (dict(kv_transfer=None), "layout.kv_transfer", "NoneType"),
    (dict(num_qo_heads=3, num_kv_heads=2), "layout.num_qo_heads", 3),  # GQA: whole groups of query heads
    (dict(num_qo_heads=2, num_kv_heads=4), "layout.num_qo_heads", 2),
    (dict(layer_end="4"), "layout.layer_end", "str"),
    (dict(attn_kinds="mhamha"), "layout.attn_kinds", "str"),  # a bare str is not one kind per layer
    (dict(attn_kinds=4), "layout.attn_kinds", "int"),
    (dict(attn_kinds=("mha", ["mha"], "mha", "mha")), "layout.attn_kinds[1]", "list"),
    (dict(dtype=["float16"]), "layout.dtype", "list"),
    (dict(rotary_theta=math.nan), "layout.rotary_theta", NAN),
    (dict(rotary_scale=math.inf), "layout.rotary_scale", math.inf),
]


@pytest.mark.parametrize("change, field, got", BAD_LAYOUT_VALUES, ids=[f for _, f, _ in BAD_LAYOUT_VALUES])
def test_bad_layout_value_raises_field_error_naming_the_field(change, field, got):
    with pytest.raises(FieldError) as info:
        KVLayout(**{**TVM_TEST_LAYOUT, **change})
    assert info.value.field == field
    assert str(info.value).startswith(field + ": expected ")
    if got is NAN:
        assert math.isnan(info.value.got)
    else:
        assert info.value.got == (next(iter(change.values())) if got is PASSED else got)


BAD_LIMITS = [
    (dict(reserved_num_seqs=0), "limits.reserved_num_seqs", 0),
    (dict(max_total_seq_len=-1), "limits.max_total_seq_len", -1),
    (dict(prefill_chunk_size=0), "limits.prefill_chunk_size", 0),
    (dict(prefill_chunk_size=2.0), "limits.prefill_chunk_size", "float"),
    (dict(reserved_num_seqs=False), "limits.reserved_num_seqs", "bool"),
]


@pytest.mark.parametrize("change, field, got", BAD_LIMITS, ids=[f for _, f, _ in BAD_LIMITS])
def test_bad_limit_raises_field_error_naming_the_field(change, field, got):
    with pytest.raises(FieldError) as info:
        CacheLimits(**change)
    assert info.value.field == field
    assert info.value.got == got


def test_zero_max_total_seq_len_is_allowed():
    assert CacheLimits(max_total_seq_len=0).num_total_pages(16) == 1
