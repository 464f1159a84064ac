"""The manifest/chunk container format (kvckpt_web/durable/FORMAT.md), version 1."""

from __future__ import annotations

import copy
import hashlib
import json
import struct
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvckpt_web.durable.container import (FORMAT_VERSION, MAGIC, MAX_BODY_BYTES, ChunkRef, Manifest, decode_manifest,
                                          encode_manifest, plan_chunks, split_group, verify_chunk)
from kvckpt_web.durable.keys import MAX_INT, chunk_digest, chunk_key
from kvckpt_web.errors import CorruptionError, FieldError, FormatError, KVCkptError
from kvckpt_web.jsontext import MAX_NESTING

C0, C1 = bytes(range(16)), bytes(range(16, 24))
D0 = "be45cb2605bf36bebde684841a28f0fd43c69850a3dce5fedba69928ee3a8991"
D1 = "b2aaa79d46b694069b0842d6c933236a0865142674a56a957ebae5f2028af6b9"

SMALL = Manifest(
    name="seq-a",
    generation=2,
    tvm_metadata='{"layout_hash":"00ff","seq_length":5}',
    page_bytes=8,
    pages_per_chunk=2,
    num_logical_pages=3,
    chunks=[[ChunkRef(0, 0, 2, 16, D0), ChunkRef(0, 2, 1, 8, D1)]],
    app_state={"tokens": [1, 2, 3], "rng": "x"},
    created_ms=1700000000000,
)

GOLDEN = (
    bytes.fromhex("4b56434b4d46535401000000f5010000")  # "KVCKMFST", version 1, body length 501
    + b'{"app_state":{"rng":"x","tokens":[1,2,3]},"chunks":[[{"first_page":0,"nbytes":16,"num_pages":2,'
    b'"sha256":"be45cb2605bf36bebde684841a28f0fd43c69850a3dce5fedba69928ee3a8991"},{"first_page":2,'
    b'"nbytes":8,"num_pages":1,"sha256":"b2aaa79d46b694069b0842d6c933236a0865142674a56a957ebae5f2028af6b9"}]],'
    b'"created_ms":1700000000000,"format_version":1,"generation":2,"name":"seq-a","num_groups":1,'
    b'"num_logical_pages":3,"page_bytes":8,"pages_per_chunk":2,'
    b'"tvm_metadata":"{\\"layout_hash\\":\\"00ff\\",\\"seq_length\\":5}"}'
    + bytes.fromhex("f76005630950a737c9a7a38692c49df5dc23a1249d70a2ca2f1130d893a23194")
)


def seal(body: Any, *, magic: bytes = MAGIC, version: int = FORMAT_VERSION, body_len: int | None = None) -> bytes:
    """An envelope around ``body`` (dict -> JSON, str -> UTF-8, bytes as is) with a correct checksum."""
    if isinstance(body, (dict, list)):
        body = json.dumps(body)
    if isinstance(body, str):
        body = body.encode("utf-8")
    head = magic + struct.pack("<II", version, len(body) if body_len is None else body_len) + body
    return head + hashlib.sha256(head).digest()


def small_body() -> dict[str, Any]:
    return json.loads(GOLDEN[16:-32])


# -- golden bytes and round trips --------------------------------------------------


def test_golden_bytes() -> None:
    assert chunk_digest(C0) == D0 and chunk_digest(C1) == D1
    assert encode_manifest(SMALL) == GOLDEN
    assert decode_manifest(GOLDEN) == SMALL
    assert len(GOLDEN) == 16 + 501 + 32


def test_round_trip_and_determinism() -> None:
    data = encode_manifest(SMALL)
    m = decode_manifest(bytearray(data))
    assert m == SMALL
    assert encode_manifest(m) == data
    assert m.num_groups == 1
    assert m.key == "manifests/seq-a/00000000000000000002"
    assert [r.key for r in m.chunk_refs()] == [chunk_key(D0), chunk_key(D1)]
    assert m.chunk_keys() == {chunk_key(D0), chunk_key(D1)}
    assert isinstance(m.chunks, tuple) and isinstance(m.chunks[0], tuple)


def test_key_order_and_whitespace_do_not_matter_to_the_reader() -> None:
    body = small_body()
    text = json.dumps(dict(reversed(list(body.items()))), indent=2)
    assert decode_manifest(seal(text)) == SMALL


def test_empty_sequence_and_many_groups() -> None:
    m = Manifest("empty", 1, "{}", 4, 3, 0, [[], [], []], {}, 0)
    assert decode_manifest(encode_manifest(m)) == m
    assert m.num_groups == 3


def test_created_ms_defaults_to_now() -> None:
    m = Manifest("s", 1, "{}", 4, 1, 0, [[]])
    assert m.created_ms > 1_600_000_000_000


def test_unicode_and_nested_app_state() -> None:
    m = Manifest("s", 7, '{"k":"ü"}', 4, 1, 0, [[]], {"text": "héllo ✓", "rng": {"state": [1, 2.5, None, True]}}, 5)
    data = encode_manifest(m)
    assert "héllo ✓".encode() in data  # UTF-8, not \u escapes
    assert decode_manifest(data) == m


def _nested(depth: int) -> Any:
    value: Any = 0
    for _ in range(depth):
        value = [value]
    return value


def test_app_state_nested_to_the_limit_round_trips() -> None:
    # the body adds one level around app_state
    m = Manifest("s", 1, "{}", 4, 1, 0, [[]], {"deep": _nested(MAX_NESTING - 2)}, 5)
    assert decode_manifest(encode_manifest(m)) == m


def test_app_state_nested_past_the_limit_is_refused_by_the_writer() -> None:
    m = Manifest("s", 1, "{}", 4, 1, 0, [[]], {"deep": _nested(MAX_NESTING)}, 5)
    with pytest.raises(FormatError) as info:
        encode_manifest(m)
    assert info.value.field == "app_state"


@pytest.mark.parametrize("app_state, field, got", [
    ({1: "one"}, "app_state key 1", "int"),
    ({"turns": [{"ids": {None: 0}}]}, "app_state.turns[0].ids key None", "NoneType"),
    ({"a b": {(1, 2): 0}}, "app_state['a b'] key (1, 2)", "tuple"),
], ids=["top-level int", "nested None", "tuple under a key with a space"])
def test_an_app_state_key_that_is_not_a_string_is_refused_by_the_writer_naming_its_path(app_state, field, got) -> None:
    # JSON has only string keys: json.dumps would write 1 as "1", and it would come back as another key
    with pytest.raises(FormatError) as info:
        encode_manifest(Manifest("s", 1, "{}", 4, 1, 0, [[]], app_state, 5))
    assert (info.value.field, info.value.got) == (field, got)


def test_an_app_state_that_contains_itself_is_refused_by_the_writer() -> None:
    turns: list[Any] = []
    turns.append({"turns": turns})
    with pytest.raises(FormatError):
        encode_manifest(Manifest("s", 1, "{}", 4, 1, 0, [[]], {"turns": turns}, 5))


def test_a_body_nested_past_the_limit_is_refused_before_parsing() -> None:
    body = small_body()
    body["app_state"] = {"deep": _nested(MAX_NESTING)}
    with pytest.raises(FormatError) as info:
        decode_manifest(seal(body))
    assert info.value.field == "body" and f"at most {MAX_NESTING}" in str(info.value)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)


@st.composite
def manifests(draw: st.DrawFn) -> Manifest:
    page_bytes = draw(st.integers(1, 64))
    per_chunk = draw(st.integers(1, 5))
    num_pages = draw(st.integers(0, 12))
    num_groups = draw(st.integers(1, 3))
    table = []
    for g in range(num_groups):
        digests = st.text("0123456789abcdef", min_size=64, max_size=64)
        table.append([ChunkRef(g, f, n, n * page_bytes, draw(digests)) for f, n in plan_chunks(num_pages, per_chunk)])
    return Manifest(
        name=draw(st.from_regex(r"[A-Za-z0-9._-]{1,128}", fullmatch=True).filter(lambda s: s not in (".", ".."))),
        generation=draw(st.integers(1, MAX_INT)),
        tvm_metadata=json.dumps(draw(st.dictionaries(st.text(max_size=5), json_values, max_size=3))),
        page_bytes=page_bytes,
        pages_per_chunk=per_chunk,
        num_logical_pages=num_pages,
        chunks=table,
        app_state=draw(st.dictionaries(st.text(max_size=8), json_values, max_size=5)),
        created_ms=draw(st.integers(0, MAX_INT)),
    )


@settings(max_examples=200, deadline=None)
@given(m=manifests())
def test_round_trip_property(m: Manifest) -> None:
    data = encode_manifest(m)
    assert decode_manifest(data) == m
    assert encode_manifest(decode_manifest(data)) == data


@settings(max_examples=200, deadline=None)
@given(m=manifests())
def test_the_writer_emits_the_canonical_json_of_format_md(m: Manifest) -> None:
    body = encode_manifest(m)[16:-32].decode("utf-8")
    assert body == json.dumps(json.loads(body), sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def test_a_chunk_ref_subclass_is_written_as_a_chunk_ref() -> None:
    class Ref(ChunkRef):
        pass

    table = [[Ref(r.group, r.first_page, r.num_pages, r.nbytes, r.sha256) for r in group] for group in SMALL.chunks]
    assert encode_manifest(_replace(chunks=table)) == encode_manifest(SMALL)


# -- every mutation is an error of ours ------------------------------------------------


def test_every_bit_flip_is_rejected() -> None:
    for bit in range(len(GOLDEN) * 8):
        data = bytearray(GOLDEN)
        data[bit // 8] ^= 1 << (bit % 8)
        with pytest.raises((FormatError, CorruptionError)):
            decode_manifest(bytes(data))


def test_every_truncation_is_rejected() -> None:
    for length in range(len(GOLDEN)):
        with pytest.raises(FormatError):
            decode_manifest(GOLDEN[:length])


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=200) | st.binary(max_size=100).map(lambda b: GOLDEN[:16] + b))
def test_random_bytes_are_rejected(data: bytes) -> None:
    with pytest.raises(KVCkptError):
        decode_manifest(data)


@settings(max_examples=300, deadline=None)
@given(body=st.binary(max_size=300) | st.text(max_size=300))
def test_sealed_garbage_body_is_a_format_error(body: bytes | str) -> None:
    with pytest.raises(FormatError):
        decode_manifest(seal(body))


def _paths(value: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix]
    if isinstance(value, dict):
        for k, v in value.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _paths(v, (*prefix, i))
    return out


SMALL_PATHS = _paths(small_body())[1:]


@settings(max_examples=500, deadline=None)
@given(path=st.sampled_from(SMALL_PATHS), value=json_values, delete=st.booleans())
def test_sealed_body_mutations_decode_or_raise_ours(path: tuple, value: Any, delete: bool) -> None:
    body = small_body()
    parent = body
    for step in path[:-1]:
        parent = parent[step]
    if delete:
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    try:
        m = decode_manifest(seal(body))
    except KVCkptError:
        return
    assert decode_manifest(encode_manifest(m)) == m


# -- one hand-made bad manifest per rejection rule --------------------------------------


def test_not_bytes() -> None:
    with pytest.raises(FormatError, match="manifest: expected bytes"):
        decode_manifest("text")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("data", "field"),
    [
        (b"", "manifest length"),
        (GOLDEN[:47], "manifest length"),
        (b"KVCKMFSU" + GOLDEN[8:], "magic"),
        (seal(small_body(), version=2), "format_version"),
        (seal(small_body(), version=0), "format_version"),
        (seal(b"{}", body_len=MAX_BODY_BYTES + 1), "body length"),
        (seal(b"{}", body_len=0xFFFFFFFF), "body length"),
        (GOLDEN[:-1], "manifest length"),
        (GOLDEN + b"\x00", "manifest length"),
        (seal(b"{}", body_len=3), "manifest length"),
    ],
)
def test_envelope_rejections(data: bytes, field: str) -> None:
    with pytest.raises(FormatError) as info:
        decode_manifest(data)
    assert info.value.field == field
    assert "expected" in str(info.value) and "got" in str(info.value)


def test_checksum_mismatch_is_corruption() -> None:
    data = bytearray(GOLDEN)
    data[-1] ^= 0xFF
    with pytest.raises(CorruptionError, match="checksum: expected sha256 .*, got f76005"):
        decode_manifest(bytes(data))
    data = bytearray(GOLDEN)
    data[40] ^= 0x01  # inside the body
    with pytest.raises(CorruptionError, match="checksum"):
        decode_manifest(bytes(data))


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (b"\xff\xfe{}", "body"),  # not UTF-8
        ("\ufeff{}", "body"),  # BOM
        ("{", "body"),  # not JSON
        ('{"a":1,"a":2}', "body"),  # duplicate key
        ("[]", "body"),  # not an object
        ('{"x": NaN}', "body"),
        ('{"x": 1e999}', "body"),
        ("[" * 100_000 + "]" * 100_000, "body"),  # too deep
    ],
)
def test_json_level_rejections(body: bytes | str, field: str) -> None:
    with pytest.raises(FormatError) as info:
        decode_manifest(seal(body))
    assert info.value.field == field


def _with(path: tuple, value: Any) -> dict[str, Any]:
    body = small_body()
    parent = body
    for step in path[:-1]:
        parent = parent[step]
    if value is DELETE:
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    return body


DELETE = object()
E0 = ("chunks", 0, 0)
E1 = ("chunks", 0, 1)

BODY_RULES = [
    # top level: exact key set
    (("name",), DELETE, "body"),
    (("extra",), 1, "body"),
    # scalar fields
    (("format_version",), 2, "body.format_version"),
    (("format_version",), "1", "body.format_version"),
    (("name",), "", "name"),
    (("name",), "a/b", "name"),
    (("name",), "..", "name"),
    (("name",), "x" * 129, "name"),
    (("name",), 5, "name"),
    (("generation",), 0, "body.generation"),
    (("generation",), 1.0, "body.generation"),
    (("generation",), True, "body.generation"),
    (("generation",), MAX_INT + 1, "body.generation"),
    (("created_ms",), -1, "body.created_ms"),
    (("created_ms",), "now", "body.created_ms"),
    (("tvm_metadata",), 5, "body.tvm_metadata"),
    (("tvm_metadata",), "not json", "body.tvm_metadata"),
    (("tvm_metadata",), "[1, 2]", "body.tvm_metadata"),
    (("page_bytes",), 0, "body.page_bytes"),
    (("pages_per_chunk",), 0, "body.pages_per_chunk"),
    (("pages_per_chunk",), None, "body.pages_per_chunk"),
    (("num_groups",), 0, "body.num_groups"),
    (("num_groups",), 2, "chunks"),
    (("num_logical_pages",), -1, "body.num_logical_pages"),
    (("num_logical_pages",), MAX_INT, "body.num_logical_pages*page_bytes"),
    (("num_logical_pages",), 5, "chunks[0]"),  # table covers 3 pages, not 5
    (("num_logical_pages",), 4, "chunks[0][1].num_pages"),
    (("app_state",), [], "body.app_state"),
    # chunk table structure
    (("chunks",), {}, "chunks"),
    (("chunks", 0), "x", "chunks[0]"),
    (E0, [0, 2, 16, D0], "chunks[0][0]"),
    (E0 + ("sha256",), DELETE, "chunks[0][0]"),
    (E0 + ("extra",), 0, "chunks[0][0]"),
    # contiguous, in order, exact cover
    (E1 + ("first_page",), 3, "chunks[0][1].first_page"),
    (E0 + ("first_page",), 1, "chunks[0][0].first_page"),
    (E0 + ("num_pages",), 1, "chunks[0][0].num_pages"),
    (E0 + ("num_pages",), 0, "chunks[0][0].num_pages"),
    (E1 + ("num_pages",), 2, "chunks[0][1].num_pages"),
    # sizes and digests
    (E0 + ("nbytes",), 15, "chunks[0][0].nbytes"),
    (E0 + ("nbytes",), "16", "chunks[0][0].nbytes"),
    (E0 + ("sha256",), D0.upper(), "chunks[0][0].sha256"),
    (E0 + ("sha256",), D0[:-1], "chunks[0][0].sha256"),
    (E0 + ("sha256",), D0[:-1] + "g", "chunks[0][0].sha256"),
    (E0 + ("sha256",), 5, "chunks[0][0].sha256"),
]


@pytest.mark.parametrize(("path", "value", "field"), BODY_RULES, ids=[f"{r[2]}={r[1]!r:.20}" for r in BODY_RULES])
def test_body_rejections(path: tuple, value: Any, field: str) -> None:
    with pytest.raises(FormatError) as info:
        decode_manifest(seal(_with(path, value)))
    assert info.value.field == field
    message = str(info.value)
    assert message.startswith(field) and "expected" in message and "got" in message


def test_chunk_order_swapped() -> None:
    body = small_body()
    body["chunks"][0].reverse()
    with pytest.raises(FormatError, match=r"chunks\[0\]\[0\].first_page: expected 0, got 2"):
        decode_manifest(seal(body))


def test_extra_and_missing_chunks() -> None:
    body = small_body()
    body["chunks"][0].append(copy.deepcopy(body["chunks"][0][1]))
    with pytest.raises(FormatError, match=r"chunks\[0\]: expected 2 chunks .*got '3 chunks'"):
        decode_manifest(seal(body))
    body["chunks"][0][1:] = []
    with pytest.raises(FormatError, match=r"chunks\[0\]"):
        decode_manifest(seal(body))


# -- the writer refuses what the reader would refuse -----------------------------------


def _replace(**changes: Any) -> Manifest:
    fields = {f: getattr(SMALL, f) for f in SMALL.__dataclass_fields__}
    return Manifest(**{**fields, **changes})


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"chunks": [[ChunkRef(1, 0, 2, 16, D0), ChunkRef(1, 2, 1, 8, D1)]]}, "chunks[0][0].group"),
        ({"chunks": [["not a ref"]]}, "chunks[0][0]"),
        ({"chunks": [5]}, "chunks[0]"),
        ({"chunks": 5}, "chunks"),
        ({"chunks": []}, "body.num_groups"),
        ({"chunks": [[ChunkRef(0, 0, 2, 16, D0)]]}, "chunks[0]"),
        ({"chunks": [[ChunkRef(0, 0, 2, 16.0, D0), ChunkRef(0, 2, 1, 8, D1)]]}, "chunks[0][0].nbytes"),
        ({"chunks": [[ChunkRef(0, 0, 2, 16, D0), ChunkRef(0, True, 1, 8, D1)]]}, "chunks[0][1].first_page"),
        ({"chunks": [[ChunkRef(0, 0, 2, 16, D0.upper()), ChunkRef(0, 2, 1, 8, D1)]]}, "chunks[0][0].sha256"),
        ({"app_state": {"x": object()}}, "body"),
        ({"app_state": {"x": float("nan")}}, "body"),
        ({"app_state": {"x": "\ud800"}}, "body"),
        ({"app_state": None}, "body.app_state"),
        ({"name": "bad name"}, "name"),
        ({"generation": 0}, "body.generation"),
        ({"tvm_metadata": "{"}, "body.tvm_metadata"),
    ],
)
def test_encode_rejects_invalid(changes: dict[str, Any], field: str) -> None:
    with pytest.raises(FormatError) as info:
        encode_manifest(_replace(**changes))
    assert info.value.field == field


def test_metadata_vouched_for_is_written_the_same_and_not_parsed_again() -> None:
    assert encode_manifest(SMALL, metadata_is_valid=True) == encode_manifest(SMALL)
    vouched = _replace(tvm_metadata="{")  # a caller that vouches wrongly writes what the reader refuses
    with pytest.raises(FormatError, match="tvm_metadata"):
        decode_manifest(encode_manifest(vouched, metadata_is_valid=True))


def test_encode_rejects_non_manifest() -> None:
    with pytest.raises(FormatError, match="manifest"):
        encode_manifest({"name": "x"})  # type: ignore[arg-type]


# -- chunks ------------------------------------------------------------------------------


def test_verify_chunk() -> None:
    ref = ChunkRef(3, 4, 2, 16, D0)
    assert verify_chunk(ref, memoryview(C0)) == C0
    with pytest.raises(CorruptionError, match=rf"chunks/{D0} \(group 3, pages 4..5\).*missing"):
        verify_chunk(ref, None)
    with pytest.raises(CorruptionError, match=r"group 3, pages 4..5\): nbytes expected 16, got 15"):
        verify_chunk(ref, C0[:15])
    with pytest.raises(CorruptionError, match=rf"sha256 expected {D0}, got {D1}"):
        verify_chunk(ChunkRef(3, 4, 1, 8, D0), C1)


def test_split_group() -> None:
    data = bytes(range(40))  # 5 pages of 8 bytes
    pieces = split_group(2, data, 8, 2)
    assert [(r.group, r.first_page, r.num_pages, r.nbytes) for r, _ in pieces] == [
        (2, 0, 2, 16),
        (2, 2, 2, 16),
        (2, 4, 1, 8),
    ]
    assert b"".join(chunk for _, chunk in pieces) == data
    for ref, chunk in pieces:
        assert verify_chunk(ref, chunk) == chunk
    assert split_group(0, b"", 8, 2) == []
    with pytest.raises(FieldError, match="a multiple of page_bytes=8"):
        split_group(0, data[:-1], 8, 2)


# -- plan_chunks -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pages", "per_chunk", "plan"),
    [
        (0, 4, []),
        (1, 4, [(0, 1)]),
        (4, 4, [(0, 4)]),
        (8, 4, [(0, 4), (4, 4)]),
        (9, 4, [(0, 4), (4, 4), (8, 1)]),
        (3, 1, [(0, 1), (1, 1), (2, 1)]),
        (5, 100, [(0, 5)]),
    ],
)
def test_plan_chunks(pages: int, per_chunk: int, plan: list[tuple[int, int]]) -> None:
    assert plan_chunks(pages, per_chunk) == plan


@pytest.mark.parametrize(
    ("pages", "per_chunk", "field"),
    [(-1, 4, "num_logical_pages"), (4, 0, "pages_per_chunk"), (4, -2, "pages_per_chunk"),
     (2.0, 1, "num_logical_pages"), (2, True, "pages_per_chunk")],
)
def test_plan_chunks_rejects(pages: Any, per_chunk: Any, field: str) -> None:
    with pytest.raises(FieldError) as info:
        plan_chunks(pages, per_chunk)
    assert info.value.field == field


@given(pages=st.integers(0, 10_000), per_chunk=st.integers(1, 10_000))
def test_plan_chunks_covers_exactly(pages: int, per_chunk: int) -> None:
    plan = plan_chunks(pages, per_chunk)
    assert sum(n for _, n in plan) == pages
    expected_first = 0
    for i, (first, n) in enumerate(plan):
        assert first == expected_first
        assert 1 <= n <= per_chunk
        assert n == per_chunk or i == len(plan) - 1
        expected_first += n
