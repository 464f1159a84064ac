"""Checkpoint metadata: the fields and exact text TVM writes, and every check of prepare_import.

Golden texts were produced once by Apache TVM 0.27's ``get_checkpoint_metadata`` for
the same cache state and are hard-coded, so these tests need no TVM. The rejection
tests port TVM's ``test_checkpoint_prepare_import_validates_metadata`` and go
further: each asserts the error type and its ``field``, ``expected`` and ``got``.
"""

from __future__ import annotations

import json

import pytest

from kvckpt_web import CacheLimits, CheckpointStateError, KVLayout, LayoutHashMismatch, MetadataError
from kvckpt_web.tvm.metadata import dump_tvm_json, parse_metadata, tvm_json_double, validate_import, write_metadata

from support.kvmodel import device_array_from, run

# ----- TVM's test configuration (tests/python/relax/test_runtime_builtin_kv_cache_checkpoint.py) ---------

TVM_LAYOUT = dict(page_size=16, num_layers=4, num_qo_heads=32, num_kv_heads=4, qk_head_dim=64)
TVM_LIMITS = dict(reserved_num_seqs=4, max_total_seq_len=128, prefill_chunk_size=64)
PAGE = 16
SEQ_LEN = PAGE + 1  # TVM's append_tokens default


def tvm_layout(**overrides) -> KVLayout:
    return KVLayout(**{**TVM_LAYOUT, **overrides})


def tvm_limits(**overrides) -> CacheLimits:
    return CacheLimits(**{**TVM_LIMITS, **overrides})


def tvm_metadata(seq_length: int = SEQ_LEN, seq_id: int = 0, **layout_overrides) -> str:
    """The metadata TVM's source cache reports after append_tokens (computed without a device)."""
    return write_metadata(tvm_layout(**layout_overrides), tvm_limits(), seq_id, seq_length)


def append_tokens(cache, seq_id: int = 0, n: int = SEQ_LEN) -> None:
    """TVM's append_tokens: add a sequence and reserve ``n`` tokens (no K/V written)."""
    cache.add_sequence(seq_id)
    cache.begin_forward([seq_id], [n])
    cache.end_forward()


GOLDEN_SMALL_F16_NONE = (
    '{"format_version":1,"cache_type":"relax.vm.PagedAttentionKVCache","page_size":4,"num_layers":2'
    ',"layer_begin":0,"layer_end":2,"num_qo_heads":4,"num_kv_heads":2,"qk_head_dim":8,"v_head_dim":8'
    ',"reserved_num_seqs":4,"num_total_pages":17,"prefill_chunk_size":32,"dtype":"float16"'
    ',"attn_kinds":["mha","mha"],"rope_mode":"none","rotary_scale":1.0,"rotary_theta":10000.0'
    ',"has_rope_ext_factors":false,"support_sliding_window":false,"support_layer_sliding_window":false'
    ',"page_group_layout":"1,num_logical_pages,2,num_kv_heads,page_size,qk_head_dim"'
    ',"layout_hash":"3e52f28ab5c525dd","seq_id":0,"seq_length":5,"logical_pages":[{"logical_page_index":0'
    ',"start_pos":0,"length":4},{"logical_page_index":1,"start_pos":4,"length":1}],"groups":[{"group_index":0'
    ',"layer_begin":0,"layer_end":1,"num_logical_pages":2,"dtype":"float16","shape":[1,2,2,2,4,8]'
    ',"nbytes":512},{"group_index":1,"layer_begin":1,"layer_end":2,"num_logical_pages":2,"dtype":"float16"'
    ',"shape":[1,2,2,2,4,8],"nbytes":512}]}'
)

GOLDEN_F32_INLINE_LB2 = (
    '{"format_version":1,"cache_type":"relax.vm.PagedAttentionKVCache","page_size":1,"num_layers":2'
    ',"layer_begin":2,"layer_end":4,"num_qo_heads":4,"num_kv_heads":4,"qk_head_dim":32,"v_head_dim":32'
    ',"reserved_num_seqs":4,"num_total_pages":513,"prefill_chunk_size":128,"dtype":"float32"'
    ',"attn_kinds":["mha","mha"],"rope_mode":"inline","rotary_scale":0.5,"rotary_theta":500000.5'
    ',"has_rope_ext_factors":false,"support_sliding_window":false,"support_layer_sliding_window":false'
    ',"page_group_layout":"1,num_logical_pages,2,num_kv_heads,page_size,qk_head_dim"'
    ',"layout_hash":"929c11f91cbae4ac","seq_id":0,"seq_length":3,"logical_pages":[{"logical_page_index":0'
    ',"start_pos":0,"length":1},{"logical_page_index":1,"start_pos":1,"length":1},{"logical_page_index":2'
    ',"start_pos":2,"length":1}],"groups":[{"group_index":0,"layer_begin":2,"layer_end":3'
    ',"num_logical_pages":3,"dtype":"float32","shape":[1,3,2,4,1,32],"nbytes":3072},{"group_index":1'
    ',"layer_begin":3,"layer_end":4,"num_logical_pages":3,"dtype":"float32","shape":[1,3,2,4,1,32]'
    ',"nbytes":3072}]}'
)

GOLDEN_BF16_SCALE01_THETA1E16 = (
    '{"format_version":1,"cache_type":"relax.vm.PagedAttentionKVCache","page_size":8,"num_layers":1'
    ',"layer_begin":0,"layer_end":1,"num_qo_heads":2,"num_kv_heads":1,"qk_head_dim":16,"v_head_dim":16'
    ',"reserved_num_seqs":2,"num_total_pages":5,"prefill_chunk_size":16,"dtype":"bfloat16"'
    ',"attn_kinds":["mha"],"rope_mode":"normal","rotary_scale":0.10000000000000001'
    ',"rotary_theta":10000000000000000,"has_rope_ext_factors":false,"support_sliding_window":false'
    ',"support_layer_sliding_window":false,"page_group_layout":"1,num_logical_pages,2,num_kv_heads,page_size'
    ',qk_head_dim","layout_hash":"9ef04b0f40f20772","seq_id":0,"seq_length":8'
    ',"logical_pages":[{"logical_page_index":0,"start_pos":0,"length":8}],"groups":[{"group_index":0'
    ',"layer_begin":0,"layer_end":1,"num_logical_pages":1,"dtype":"bfloat16","shape":[1,1,2,1,8,16]'
    ',"nbytes":512}]}'
)

GOLDEN_F16_THETA1E17 = (
    '{"format_version":1,"cache_type":"relax.vm.PagedAttentionKVCache","page_size":4,"num_layers":1'
    ',"layer_begin":0,"layer_end":1,"num_qo_heads":2,"num_kv_heads":2,"qk_head_dim":33,"v_head_dim":33'
    ',"reserved_num_seqs":4,"num_total_pages":5,"prefill_chunk_size":16,"dtype":"float16"'
    ',"attn_kinds":["mha"],"rope_mode":"normal","rotary_scale":1.0,"rotary_theta":1e+17'
    ',"has_rope_ext_factors":false,"support_sliding_window":false,"support_layer_sliding_window":false'
    ',"page_group_layout":"1,num_logical_pages,2,num_kv_heads,page_size,qk_head_dim"'
    ',"layout_hash":"2f20a3222ed3e588","seq_id":0,"seq_length":0,"logical_pages":[]'
    ',"groups":[{"group_index":0,"layer_begin":0,"layer_end":1,"num_logical_pages":0,"dtype":"float16"'
    ',"shape":[1,0,2,2,4,33],"nbytes":0}]}'
)

#: name -> (layout kwargs, limits kwargs, sequence length, TVM's metadata text)
GOLDEN = {
    "f16-rope_none-5_tokens": (dict(page_size=4, num_layers=2, num_qo_heads=4, num_kv_heads=2, qk_head_dim=8,
                                    rope_mode="none"), dict(reserved_num_seqs=4, max_total_seq_len=64,
                                                            prefill_chunk_size=32), 5, GOLDEN_SMALL_F16_NONE),
    "f32-inline-page1-layer_begin2": (dict(page_size=1, num_layers=2, num_qo_heads=4, num_kv_heads=4, qk_head_dim=32,
                                           dtype="float32", layer_begin=2, rope_mode="inline", rotary_scale=0.5,
                                           rotary_theta=500000.5),
                                      dict(reserved_num_seqs=4, max_total_seq_len=512, prefill_chunk_size=128), 3,
                                      GOLDEN_F32_INLINE_LB2),
    "bf16-scale0.1-theta1e16-full_page": (dict(page_size=8, num_layers=1, num_qo_heads=2, num_kv_heads=1,
                                               qk_head_dim=16, dtype="bfloat16", rotary_scale=0.1, rotary_theta=1e16),
                                          dict(reserved_num_seqs=2, max_total_seq_len=32, prefill_chunk_size=16), 8,
                                          GOLDEN_BF16_SCALE01_THETA1E16),
    "f16-odd_head_dim-theta1e17-empty": (dict(page_size=4, num_layers=1, num_qo_heads=2, num_kv_heads=2,
                                              qk_head_dim=33, rotary_theta=1e17),
                                         dict(reserved_num_seqs=4, max_total_seq_len=16, prefill_chunk_size=16), 0,
                                         GOLDEN_F16_THETA1E17),
}


# ----- what the metadata reports -----------------------------------------------------------------------


def test_checkpoint_metadata_reports_layout_pages_and_groups(make_model):
    """Port of TVM's test_checkpoint_metadata_reports_layout_pages_and_groups."""
    source = make_model(tvm_layout(), tvm_limits())
    source.add(0, SEQ_LEN)
    cache = source.cache
    metadata_json = cache.get_checkpoint_metadata(0)
    metadata = json.loads(metadata_json)

    assert metadata["format_version"] == 1
    assert metadata["cache_type"] == "relax.vm.PagedAttentionKVCache"
    assert metadata["layout_hash"] == cache.get_layout_hash()
    assert metadata["seq_id"] == 0
    assert metadata["seq_length"] == PAGE + 1
    assert metadata["page_size"] == PAGE
    assert metadata["dtype"] == "float16"
    assert metadata["layer_begin"] == 0
    assert metadata["layer_end"] == 4
    assert metadata["num_kv_heads"] == 4
    assert metadata["qk_head_dim"] == 64
    assert metadata["v_head_dim"] == 64
    assert metadata["reserved_num_seqs"] == 4
    assert metadata["attn_kinds"] == ["mha"] * 4
    assert metadata["page_group_layout"] == "1,num_logical_pages,2,num_kv_heads,page_size,qk_head_dim"
    assert "blocks" not in metadata
    assert len(metadata["logical_pages"]) == 2
    assert metadata["logical_pages"][0]["start_pos"] == 0
    assert metadata["logical_pages"][0]["length"] == PAGE
    assert metadata["logical_pages"][1]["start_pos"] == PAGE
    assert metadata["logical_pages"][1]["length"] == 1
    assert "page_id" not in metadata["logical_pages"][0]
    assert "block_index" not in metadata["logical_pages"][0]
    assert len(metadata["groups"]) == 4
    assert metadata["groups"][0]["layer_begin"] == 0
    assert metadata["groups"][0]["layer_end"] == 1
    assert metadata["groups"][0]["num_logical_pages"] == 2
    assert metadata["groups"][0]["dtype"] == "float16"
    assert metadata["groups"][0]["shape"] == [1, 2, 2, 4, PAGE, 64]

    exported = []
    for group_metadata in metadata["groups"]:
        group = cache.empty_group(group_metadata["shape"][1])
        cache.export_page_group(0, group_metadata["group_index"], group)
        exported.append(group)

    target = make_model(tvm_layout(), tvm_limits(reserved_num_seqs=8, max_total_seq_len=256, prefill_chunk_size=32))
    target.cache.prepare_import(0, metadata_json)
    with pytest.raises(CheckpointStateError, match="until checkpoint import is finished"):
        target.cache.get_sequence_length(0)
    for group_metadata, group in zip(metadata["groups"], exported):
        target.cache.import_page_group(0, group_metadata["group_index"], group)
    target.cache.finish_import(0)
    assert target.cache.get_sequence_length(0) == PAGE + 1
    target.ref[0] = source.ref[0]
    target.assert_holds(0)


@pytest.mark.parametrize("name", GOLDEN)
def test_metadata_text_is_byte_identical_to_tvm(make_cache, name):
    layout, limits, length, text = GOLDEN[name]
    cache = make_cache(KVLayout(**layout), CacheLimits(**limits))
    cache.add_sequence(0)
    if length:
        cache.begin_forward([0], [length])
        cache.end_forward()
    assert cache.get_checkpoint_metadata(0) == text


def test_metadata_text_prints_doubles_as_tvm():
    assert '"rotary_scale":1.0,"rotary_theta":10000.0,' in GOLDEN_SMALL_F16_NONE
    assert '"rotary_scale":0.10000000000000001,"rotary_theta":10000000000000000,' in GOLDEN_BF16_SCALE01_THETA1E16
    assert '"rotary_theta":1e+17,' in GOLDEN_F16_THETA1E17
    for name in GOLDEN:
        layout, limits, length, text = GOLDEN[name]
        assert write_metadata(KVLayout(**layout), CacheLimits(**limits), 0, length) == text


def test_metadata_of_another_sequence_differs_only_in_seq_id(make_cache):
    layout, limits, length, text = GOLDEN["f16-rope_none-5_tokens"]
    cache = make_cache(KVLayout(**layout), CacheLimits(**limits))
    cache.add_sequence(7)
    cache.begin_forward([7], [length])
    cache.end_forward()
    assert cache.get_checkpoint_metadata(7) == text.replace('"seq_id":0,', '"seq_id":7,')


def test_metadata_reflects_the_current_length(make_cache):
    cache = make_cache()
    cache.add_sequence(0)
    lengths = []
    for n in (3, 1, 4):
        cache.begin_forward([0], [n])
        cache.end_forward()
        lengths.append(json.loads(cache.get_checkpoint_metadata(0))["seq_length"])
    cache.popn(0, 2)
    lengths.append(json.loads(cache.get_checkpoint_metadata(0))["seq_length"])
    assert lengths == [3, 4, 8, 6]


# TVM 0.27's JSON writer, checked value by value against it.
TVM_DOUBLES = [
    (1.0, "1.0"), (3.0, "3.0"), (0.5, "0.5"), (10000.0, "10000.0"), (500000.5, "500000.5"),
    (0.1, "0.10000000000000001"), (1e-05, "1.0000000000000001e-05"), (2.5e-300, "2.5e-300"),
    (123456789.0, "123456789.0"), (1e15, "1000000000000000.0"), (2.0 ** 53 - 1, "9007199254740991.0"),
    (2.0 ** 53, "9007199254740992"), (1e16, "10000000000000000"), (1e16 + 2, "10000000000000002"),
    (1e17, "1e+17"), (1.5e20, "1.5e+20"), (1e300, "1.0000000000000001e+300"), (-0.0, "-0.0"),
]


@pytest.mark.parametrize("value, text", TVM_DOUBLES, ids=[t for _, t in TVM_DOUBLES])
def test_doubles_are_written_as_tvms_json_writer_does(value, text):
    assert tvm_json_double(value) == text


def test_json_is_compact_and_keeps_insertion_order():
    value = {"b": [1, 2.0, True, "x"], "a": {"z": False, "y": 0.25}}
    assert dump_tvm_json(value) == '{"b":[1,2.0,true,"x"],"a":{"z":false,"y":0.25}}'


# ----- prepare_import rejections -----------------------------------------------------------------------


def mutated(change) -> str:
    metadata = json.loads(tvm_metadata())
    change(metadata)
    return json.dumps(metadata)


def _set(key, value):
    def change(m):
        m[key] = value
    return change


def _bump_shape(m):
    m["groups"][0]["shape"][-1] += 1


def _bump_nbytes(m):
    m["groups"][0]["nbytes"] += 1


def _drop(key):
    def change(m):
        del m[key]
    return change


REJECTIONS = {
    # TVM's own cases
    "format_version": (_set("format_version", 2), {}, "metadata.format_version", 1, 2),
    "seq_length_vs_logical_pages": (_set("seq_length", PAGE * 2 + 1), {}, "metadata.logical_pages",
                                    "3 entries (sequence length 33 requires 3 logical pages)", 2),
    "group_shape": (_bump_shape, {}, "metadata.groups[0].shape[5]", 64, 65),
    "group_nbytes": (_bump_nbytes, {}, "metadata.groups[0].nbytes", 2 * 2 * 4 * PAGE * 64 * 2,
                     2 * 2 * 4 * PAGE * 64 * 2 + 1),
    # more fields
    "cache_type": (_set("cache_type", "relax.vm.RNNState"), {}, "metadata.cache_type",
                   "relax.vm.PagedAttentionKVCache", "relax.vm.RNNState"),
    "page_size": (_set("page_size", 32), {}, "metadata.page_size", 16, 32),
    "num_kv_heads": (_set("num_kv_heads", 8), {}, "metadata.num_kv_heads", 4, 8),
    "rope_mode": (_set("rope_mode", "none"), {}, "metadata.rope_mode", "normal", "none"),
    "rotary_theta": (_set("rotary_theta", 500000.0), {}, "metadata.rotary_theta", 10000.0, 500000.0),
    "page_group_layout": (_set("page_group_layout", "1,2,3"), {}, "metadata.page_group_layout",
                          "1,num_logical_pages,2,num_kv_heads,page_size,qk_head_dim", "1,2,3"),
    "attn_kinds_length": (_set("attn_kinds", ["mha"] * 3), {}, "metadata.attn_kinds", "4 entries", 3),
    "source_too_small": (_set("num_total_pages", 1), {}, "metadata.num_total_pages",
                         ">= 2 (pages seq_length 17 needs)", 1),
    "missing_field": (_drop("groups"), {}, "metadata.groups", "a field that is present", "missing field"),
    "logical_page_length": (lambda m: m["logical_pages"][1].update(length=2), {}, "metadata.logical_pages[1].length",
                            1, 2),
    "group_count": (lambda m: m["groups"].pop(), {}, "metadata.groups", "4 entries", 3),
    "group_dtype": (lambda m: m["groups"][2].update(dtype="float32"), {}, "metadata.groups[2].dtype", "float16",
                    "float32"),
    # stricter JSON typing than TVM (never accepts what TVM rejects)
    "bool_for_int": (_set("seq_length", True), {}, "metadata.seq_length", "an int64 integer", True),
    "float_for_int": (_set("seq_length", 17.0), {}, "metadata.seq_length", "an int64 integer", 17.0),
    "string_for_number": (_set("rotary_scale", "1.0"), {}, "metadata.rotary_scale", "a number", "1.0"),
    "int_for_bool": (_set("support_sliding_window", 0), {}, "metadata.support_sliding_window", "true or false", 0),
}


@pytest.mark.parametrize("name", REJECTIONS)
def test_prepare_import_rejects_metadata_naming_field_expected_and_got(make_cache, name):
    change, limits, field, expected, got = REJECTIONS[name]
    cache = make_cache(tvm_layout(), tvm_limits(**limits))
    with pytest.raises(MetadataError) as info:
        cache.prepare_import(0, mutated(change))
    assert (info.value.field, info.value.expected, info.value.got) == (field, expected, got)
    assert str(info.value).startswith(f"{field}: expected ")


def test_prepare_import_rejects_other_dtype(make_cache):
    cache = make_cache(tvm_layout(dtype="float32"), tvm_limits())
    with pytest.raises(MetadataError, match="dtype") as info:
        cache.prepare_import(0, tvm_metadata())
    assert (info.value.field, info.value.expected, info.value.got) == ("metadata.dtype", "float32", "float16")


def test_prepare_import_rejects_a_sequence_longer_than_the_cache(make_cache):
    cache = make_cache(tvm_layout(), tvm_limits(max_total_seq_len=0))
    with pytest.raises(MetadataError, match="only has 1 pages") as info:
        cache.prepare_import(0, tvm_metadata())
    assert (info.value.field, info.value.got) == ("metadata.seq_length", "17 tokens = 2 pages")
    assert info.value.expected == "at most 1 pages (this cache only has 1 pages)"


def test_prepare_import_rejects_a_layout_hash_mismatch(make_cache):
    cache = make_cache(tvm_layout(), tvm_limits())
    with pytest.raises(LayoutHashMismatch, match="layout hash mismatch") as info:
        cache.prepare_import(0, mutated(_set("layout_hash", "bad-layout-hash")))
    assert (info.value.field, info.value.expected, info.value.got) == (
        "metadata.layout_hash", tvm_layout().layout_hash(), "bad-layout-hash")
    assert isinstance(info.value, MetadataError)


def test_prepare_import_rejects_metadata_of_another_sequence_id(make_cache):
    cache = make_cache(tvm_layout(), tvm_limits())
    with pytest.raises(MetadataError) as info:
        cache.prepare_import(1, tvm_metadata(seq_id=0))
    assert (info.value.field, info.value.expected, info.value.got) == ("metadata.seq_id", 1, 0)


@pytest.mark.parametrize("text, got", [("{", "parse error"), ("", "parse error"), ('{"a": 1,}', "parse error"),
                                       ("NaN x", "parse error")])
def test_malformed_json_is_rejected(text, got):
    with pytest.raises(MetadataError) as info:
        parse_metadata(text)
    assert info.value.field == "metadata" and info.value.expected == "valid JSON"
    assert info.value.got.startswith(got)


@pytest.mark.parametrize("text, kind", [("[]", "list"), ("17", "int"), ("null", "NoneType"), ('"{}"', "str")])
def test_json_that_is_not_an_object_is_rejected(text, kind):
    with pytest.raises(MetadataError) as info:
        parse_metadata(text)
    assert (info.value.field, info.value.expected, info.value.got) == ("metadata", "a JSON object", kind)


def test_duplicate_keys_are_rejected(make_cache):
    text = tvm_metadata()
    duplicated = text.replace('"seq_length":17,', '"seq_length":17,"seq_length":1,')
    assert duplicated != text
    with pytest.raises(MetadataError) as info:
        make_cache(tvm_layout(), tvm_limits()).prepare_import(0, duplicated)
    assert info.value.field == "metadata.seq_length"
    assert info.value.expected == "a key that appears once"


def test_undecodable_bytes_are_rejected():
    with pytest.raises(MetadataError, match="UTF-8"):
        parse_metadata(b"\xff{}")


def test_validate_import_plans_the_sequence():
    plan = validate_import(tvm_metadata(), tvm_layout(), tvm_limits(), 0)
    assert (plan.seq_id, plan.seq_length, plan.num_logical_pages) == (0, SEQ_LEN, 2)


# ----- what prepare_import accepts ---------------------------------------------------------------------


def _reversed(value):
    if isinstance(value, dict):
        return {k: _reversed(v) for k, v in reversed(list(value.items()))}
    if isinstance(value, list):
        return [_reversed(v) for v in value]
    return value


def _int_doubles(m):
    m.update(rotary_scale=1, rotary_theta=10000)
    return m


def _with_extras(m):
    m["comment"] = {"written_by": "a future version"}
    m["logical_pages"][0]["checksum"] = "abc"
    m["groups"][1]["compression"] = None
    return m


ACCEPTED = {"int_literal_doubles": _int_doubles, "reordered_keys": _reversed, "extra_keys": _with_extras}


@pytest.mark.parametrize("name", ACCEPTED)
def test_prepare_import_accepts_equivalent_metadata(make_model, name):
    source = make_model(tvm_layout(), tvm_limits())
    source.add(0, SEQ_LEN)
    original = source.cache.get_checkpoint_metadata(0)
    text = json.dumps(ACCEPTED[name](json.loads(original)))
    assert text != original
    target = make_model(tvm_layout(), tvm_limits())
    run(target.cache.load_checkpoint(text, source.export(0)))
    target.ref[0] = source.ref[0]
    target.assert_holds(0)


def test_reordering_really_reorders_nested_keys():
    metadata = _reversed(json.loads(tvm_metadata()))
    assert list(metadata)[0] == "groups" and list(metadata["groups"][0])[0] == "nbytes"


def test_prepare_import_accepts_metadata_as_utf8_bytes(make_cache):
    cache = make_cache(tvm_layout(), tvm_limits())
    cache.prepare_import(0, tvm_metadata().encode())
    cache.abort_import(0)


def test_prepare_import_accepts_a_checkpoint_from_a_cache_with_other_limits(make_cache):
    source_limits = tvm_limits(reserved_num_seqs=16, max_total_seq_len=64, prefill_chunk_size=8)
    text = write_metadata(tvm_layout(), source_limits, 0, SEQ_LEN)
    cache = make_cache(tvm_layout(), tvm_limits())
    cache.prepare_import(0, text)
    groups = [device_array_from(cache, bytes(2 * cache.layout.page_bytes), 2) for _ in range(4)]
    for g, group in enumerate(groups):
        cache.import_page_group(0, g, group)
    cache.finish_import(0)
    assert cache.get_sequence_length(0) == SEQ_LEN
