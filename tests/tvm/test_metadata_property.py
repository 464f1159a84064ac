"""Our checkpoint-metadata validator against TVM's, on mutated TVM-produced metadata.

Start from the metadata TVM's real cache writes for a small sequence, mutate it
(values, types, number spellings, missing / extra / duplicate / reordered keys,
nested logical_pages and groups entries, consistent or inconsistent resizes) and
hand the text to both ``PagedKVCache.prepare_import`` (ours) and TVM's
``prepare_import``. Properties:

* ours may be stricter than TVM, never looser: if ours accepts, TVM accepts;
* when ours rejects, it raises a :class:`~kvckpt_web.errors.KVCkptError` whose
  message names the offending field, and leaves the cache exactly as it was.

TVM rejects with ``tvm.error.InternalError`` (a failed check or a JSON parse
error) or ``TypeError`` (e.g. a float literal where it reads an int).
"""

from __future__ import annotations

import asyncio
import copy
import json
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from hypothesis import event, given, note, settings
from hypothesis import strategies as st

tvm = pytest.importorskip("tvm", reason="Apache TVM is not installed (CI installs it)")

from kvckpt_web import CacheLimits, KVLayout, PagedKVCache  # noqa: E402
from kvckpt_web.errors import BadValueError, KVCkptError, LayoutHashMismatch  # noqa: E402

from support import tvm_reference as ref

PAGE_SIZE = 4
NUM_LAYERS = 2
LAYER_BEGIN = 1
NUM_QO_HEADS, NUM_KV_HEADS, HEAD_DIM = 4, 2, 32
DTYPE = "float16"
MAX_TOTAL_SEQ_LEN = 32  # num_total_pages = 32 / 4 + 1 = 9
PREFILL_CHUNK_SIZE = 16
RESERVED_NUM_SEQS = 4
SEQ_LENGTH = 6  # two logical pages, the last one partial
NUM_TOTAL_PAGES = MAX_TOTAL_SEQ_LEN // PAGE_SIZE + 1
PAGE_BYTES = 2 * NUM_KV_HEADS * PAGE_SIZE * HEAD_DIM * 2

TVM_REJECTS = (tvm.error.InternalError, TypeError)


def run(coro: Any) -> Any:
    return asyncio.run(coro)


# --------------------------------------------------------------------------- JSON with full control of the text


class Obj(list):
    """A JSON object as an ordered list of [key, value] pairs (keeps duplicates and order)."""


@dataclass(frozen=True)
class Raw:
    """A literal written into the JSON text verbatim (number spellings Python would never emit)."""

    text: str


def parse(text: str) -> Any:
    return json.loads(text, object_pairs_hook=lambda pairs: Obj([list(p) for p in pairs]))


def dumps(value: Any) -> str:
    if isinstance(value, Raw):
        return value.text
    if isinstance(value, Obj):
        return "{" + ",".join(json.dumps(k) + ":" + dumps(v) for k, v in value) + "}"
    if isinstance(value, list):
        return "[" + ",".join(dumps(v) for v in value) + "]"
    return json.dumps(value)  # str (ASCII, \u escapes), int, float (NaN/Infinity), bool, None


def get(doc: Obj, key: str) -> Any:
    return next(v for k, v in doc if k == key)


def put(doc: Obj, key: str, value: Any) -> None:
    for pair in doc:
        if pair[0] == key:
            pair[1] = value
            return
    doc.append([key, value])


def paths(value: Any, prefix: tuple = ()) -> list[tuple]:
    """Every position in ``value``: a tuple of pair indices (objects) and element indices (arrays)."""
    out = [prefix]
    if isinstance(value, Obj):
        for i, (_, v) in enumerate(value):
            out += paths(v, prefix + (i,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += paths(v, prefix + (i,))
    return out


def node(doc: Any, path: tuple) -> Any:
    for i in path:
        doc = doc[i][1] if isinstance(doc, Obj) else doc[i]
    return doc


def set_node(doc: Any, path: tuple, value: Any) -> Any:
    if not path:
        return value
    parent = node(doc, path[:-1])
    if isinstance(parent, Obj):
        parent[path[-1]][1] = value
    else:
        parent[path[-1]] = value
    return doc


def describe(doc: Any, path: tuple) -> str:
    """``metadata.groups[1].shape[3]``-style name of a path (the way our errors name fields)."""
    name = "metadata"
    for i in path:
        if isinstance(doc, Obj):
            name += "." + doc[i][0]
            doc = doc[i][1]
        else:
            name += f"[{i}]"
            doc = doc[i]
    return name


def consistent_pages(seq_length: int, num_total_pages: int | None = None) -> dict[str, Any]:
    """logical_pages / groups (and seq_length) exactly as a cache of this layout writes them."""
    npages = -(-seq_length // PAGE_SIZE)
    fields: dict[str, Any] = {
        "seq_length": seq_length,
        "logical_pages": [Obj([["logical_page_index", i], ["start_pos", i * PAGE_SIZE],
                               ["length", min(PAGE_SIZE, seq_length - i * PAGE_SIZE)]]) for i in range(npages)],
        "groups": [Obj([["group_index", g], ["layer_begin", LAYER_BEGIN + g], ["layer_end", LAYER_BEGIN + g + 1],
                        ["num_logical_pages", npages], ["dtype", DTYPE],
                        ["shape", [1, npages, 2, NUM_KV_HEADS, PAGE_SIZE, HEAD_DIM]],
                        ["nbytes", npages * PAGE_BYTES]]) for g in range(NUM_LAYERS)],
    }
    if num_total_pages is not None:
        fields["num_total_pages"] = num_total_pages
    return fields


# --------------------------------------------------------------------------- the caches


def tvm_cache() -> ref.TVMCache:
    return ref.TVMCache(page_size=PAGE_SIZE, num_layers=NUM_LAYERS, num_qo_heads=NUM_QO_HEADS,
                        num_kv_heads=NUM_KV_HEADS, head_dim=HEAD_DIM, dtype=DTYPE, layer_begin=LAYER_BEGIN,
                        rope_mode=ref.ROPE_NORMAL, rotary_scale=1.0, rotary_theta=10000.0,
                        reserved_num_seqs=RESERVED_NUM_SEQS, max_total_seq_len=MAX_TOTAL_SEQ_LEN,
                        prefill_chunk_size=PREFILL_CHUNK_SIZE)


def our_layout() -> KVLayout:
    return KVLayout(page_size=PAGE_SIZE, num_layers=NUM_LAYERS, num_qo_heads=NUM_QO_HEADS,
                    num_kv_heads=NUM_KV_HEADS, qk_head_dim=HEAD_DIM, dtype=DTYPE, layer_begin=LAYER_BEGIN,
                    rope_mode="normal", rotary_scale=1.0, rotary_theta=10000.0)


class Ours:
    """Our cache holding sequences 0 (length 6) and 1 (length 3) with known K/V."""

    def __init__(self, device: Any) -> None:
        self.device = device
        self.cache = self._populated()
        self.snapshot = self.state()

    def _populated(self) -> PagedKVCache:
        limits = CacheLimits(reserved_num_seqs=RESERVED_NUM_SEQS, max_total_seq_len=MAX_TOTAL_SEQ_LEN,
                             prefill_chunk_size=PREFILL_CHUNK_SIZE)
        cache = PagedKVCache(self.device, our_layout(), limits)
        rng = np.random.default_rng(7)
        cache.add_sequence(1)
        cache.add_sequence(0)
        cache.begin_forward([1, 0], [3, SEQ_LENGTH])
        for layer in range(NUM_LAYERS):
            shape = (3 + SEQ_LENGTH, NUM_KV_HEADS, HEAD_DIM)
            cache.append_kv(layer, rng.standard_normal(shape).astype(DTYPE), rng.standard_normal(shape).astype(DTYPE))
        cache.end_forward()
        return cache

    def state(self) -> tuple:
        """Everything a rejected import must leave untouched."""
        c = self.cache
        lengths = {s: c.get_sequence_length(s) for s in c.sequence_ids()}  # raises while an import is in progress
        kv = {}
        for s, n in lengths.items():
            k, v = run(c.debug_get_kv(s, 0, n))
            kv[s] = (k.data, v.data)
        return c.sequence_ids(), lengths, c.get_num_available_pages(), kv

    def reset(self) -> None:
        """A fresh populated cache (after an accepted import emptied this one)."""
        self.cache.close()
        self.cache = self._populated()


@pytest.fixture(scope="module")
def base_text() -> str:
    """TVM's checkpoint metadata for sequence 0 of SEQ_LENGTH tokens."""
    source = tvm_cache()
    source.add_sequence(0)
    rng = np.random.default_rng(3)
    shape = (NUM_LAYERS, SEQ_LENGTH, NUM_KV_HEADS, HEAD_DIM)
    source.append_seq(0, rng.standard_normal(shape), rng.standard_normal(shape))
    return source.get_checkpoint_metadata(0)


@pytest.fixture(scope="module")
def oracle():
    """TVM's prepare_import as a predicate: True if TVM accepts the text."""
    cache = tvm_cache()

    def accepts(text: str) -> bool:
        try:
            cache.prepare_import(0, text)
        except TVM_REJECTS:
            return False
        return True

    return accepts


@pytest.fixture(scope="module")
def ours(device):
    holder = Ours(device)
    yield holder
    holder.cache.close()


def check_against_tvm(ours: Ours, oracle, text: str) -> KVCkptError | None:
    """Run ours and TVM on ``text``; assert the properties; return our error (None if accepted)."""
    try:
        ours.cache.prepare_import(0, text)
    except KVCkptError as exc:
        assert isinstance(exc, BadValueError), f"{type(exc).__name__} carries no field: {exc}"
        assert exc.field.startswith("metadata") and exc.field in str(exc), str(exc)
        assert ours.state() == ours.snapshot, f"rejected import changed the cache ({exc})"
        return exc
    except Exception as exc:  # noqa: BLE001 - the property is about the exception type
        pytest.fail(f"ours raised {type(exc).__name__} (not a KVCkptError): {exc}\n{text}")
    try:
        assert oracle(text), f"ours accepted metadata that TVM rejects:\n{text}"
    finally:
        ours.cache.abort_import(0)
        ours.reset()
    return None


# --------------------------------------------------------------------------- mutations

INT_LITERALS = [0, 1, -1, 2, 3, 4, 5, 8, 9, 10, 32, 64, 2**31 - 1, 2**31, -(2**31), 2**63 - 1, -(2**63), 2**63,
                -(2**63) - 1, 10**30]
RAW_LITERALS = [
    # numbers TVM's parser cannot represent (strtod range errors) or reads differently from Python
    "1e400", "-1e400", "1e-400", "-1e-400", "4.9406564584124654e-324", "2.2250738585072009e-308",
    "1" + "0" * 400, "-" + "9" * 330, "123456789012345678901234567890", "0e-400", "-0", "-0.0",
    "1E2", "4e0", "40e-1", "1.0e0", "04", "+4", "NaN", "Infinity", "-Infinity",
    # strings with lone surrogates (TVM's parser refuses them) or valid pairs (fine)
    '"\\ud800"', '"\\udc00"', '"x\\udbff"', '"\\ud800\\ud800"', '"\\ud83d\\ude00"', '"\\u0000"',
]
KNOWN_STRINGS = ["float16", "float32", "bfloat16", "mha", "MHA", "mla", "mha_sliding", "none", "normal",
                 "inline", "relax.vm.PagedAttentionKVCache", "1,num_logical_pages,2,num_kv_heads,page_size,qk_head_dim",
                 "", "0", "true", "4"]
KEYS = ["format_version", "page_size", "seq_length", "seq_id", "nbytes", "shape", "length", "attn_kinds",
        "layout_hash", "dtype", "groups", "logical_pages", "rotary_scale", "extra", ""]

texts = st.lists(st.one_of(st.characters(max_codepoint=0x7F), st.integers(0xD800, 0xDFFF).map(chr),
                           st.characters()), max_size=6).map("".join)
scalars = st.one_of(
    st.sampled_from(INT_LITERALS), st.integers(-50, 50),
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0.0, 1.0, 4.0, 10000.0, 0.1, -0.0, 1e-7]),
    st.booleans(), st.none(), st.sampled_from(KNOWN_STRINGS), texts,
    st.sampled_from(RAW_LITERALS).map(Raw),
)
values = st.one_of(
    scalars,
    st.lists(scalars, max_size=3),
    st.lists(st.tuples(st.sampled_from(KEYS) | texts, scalars), max_size=3).map(lambda kv: Obj([list(p) for p in kv])),
)


@st.composite
def mutation(draw, doc: Obj) -> tuple[Obj, str]:
    """Apply one random mutation to ``doc`` (in place); return it and a description."""
    where = draw(st.sampled_from(paths(doc)[1:]))
    target = node(doc, where)
    name = describe(doc, where)
    kind = draw(st.sampled_from(["replace", "replace", "replace", "retype", "literal", "delete", "insert",
                                 "reorder", "swap", "resize", "tweak"]))
    if kind == "replace":
        set_node(doc, where, draw(values))
    elif kind == "retype":  # int <-> float of the same value (4 -> 4.0, 1.0 -> 1), or bool <-> int
        if isinstance(target, bool):
            set_node(doc, where, int(target))
        elif isinstance(target, int):
            set_node(doc, where, draw(st.sampled_from([float(target), Raw(f"{target}e0"), Raw(f"{target}.0"),
                                                       bool(target)])))
        elif isinstance(target, float) and target.is_integer():
            set_node(doc, where, int(target))
        else:
            set_node(doc, where, draw(values))
    elif kind == "literal":
        set_node(doc, where, Raw(draw(st.sampled_from(RAW_LITERALS))))
    elif kind == "tweak":  # a nearby value of the same type
        if isinstance(target, bool):
            set_node(doc, where, not target)
        elif isinstance(target, int):
            set_node(doc, where, target + draw(st.sampled_from([-2, -1, 1, 2, PAGE_SIZE, -target])))
        elif isinstance(target, float):
            set_node(doc, where, draw(st.sampled_from([target * (1 + 2**-52), target + 0.5, -target, target * 2])))
        elif isinstance(target, str):
            set_node(doc, where, draw(st.sampled_from([target.upper(), target + " ", target[:-1], target[1:]])))
        else:
            set_node(doc, where, draw(values))
    elif kind == "delete":
        parent = node(doc, where[:-1])
        del parent[where[-1]]
    elif kind == "insert":  # a key (maybe a duplicate of an existing one) or an element
        parent = node(doc, where[:-1])
        at = draw(st.integers(0, len(parent)))
        if isinstance(parent, Obj):
            key = draw(st.sampled_from([k for k, _ in parent] + KEYS) | texts)
            parent.insert(at, [key, draw(values)])
        else:
            parent.insert(at, copy.deepcopy(draw(st.sampled_from(parent) | values)) if parent else draw(values))
    elif kind == "reorder":
        parent = node(doc, where[:-1])
        if isinstance(parent, Obj):
            parent[:] = draw(st.permutations(list(parent)))
    elif kind == "swap":
        parent = node(doc, where[:-1])
        j = draw(st.integers(0, len(parent) - 1))
        parent[where[-1]], parent[j] = parent[j], parent[where[-1]]
    elif kind == "resize":  # a consistent seq_length / logical_pages / groups set (both should accept)
        n = draw(st.integers(0, (NUM_TOTAL_PAGES + 1) * PAGE_SIZE))
        total = draw(st.sampled_from([None, None, NUM_TOTAL_PAGES + 2, 1]))
        for key, value in consistent_pages(n, total).items():
            put(doc, key, value)
        name = f"resize to seq_length {n}" + (f", num_total_pages {total}" if total else "")
    return doc, f"{kind} {name}"


@st.composite
def mutated(draw, base: str) -> tuple[str, list[str]]:
    doc = parse(base)
    done = []
    for _ in range(draw(st.integers(1, 3))):
        doc, what = draw(mutation(doc))
        done.append(what)
    return dumps(doc), done


# --------------------------------------------------------------------------- properties


def test_unmutated_tvm_metadata_is_accepted_by_both(ours, oracle, base_text):
    assert dumps(parse(base_text)) == base_text  # the mutation machinery round-trips TVM's text
    assert check_against_tvm(ours, oracle, base_text) is None


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_ours_never_accepts_what_tvm_rejects_and_rejects_cleanly(ours, oracle, base_text, data):
    text, what = data.draw(mutated(base_text), label="mutated metadata")
    note(f"mutations: {what}")
    error = check_against_tvm(ours, oracle, text)
    if error is None:
        event("both accept")
    else:
        event("ours rejects, TVM " + ("accepts (ours is stricter)" if oracle(text) else "rejects"))


@settings(max_examples=60, deadline=None)
@given(n=st.integers(0, (NUM_TOTAL_PAGES + 1) * PAGE_SIZE), reorder=st.booleans())
def test_consistent_resized_metadata_is_accepted_exactly_when_tvm_accepts_it(ours, oracle, base_text, n, reorder):
    doc = parse(base_text)
    for key, value in consistent_pages(n).items():
        put(doc, key, value)
    if reorder:
        doc.reverse()
    text = dumps(doc)
    ours_accepts = check_against_tvm(ours, oracle, text) is None
    assert ours_accepts == oracle(text) == (n <= NUM_TOTAL_PAGES * PAGE_SIZE)


# --------------------------------------------------------------------------- explicit examples: every field TVM checks

# (path from the top of the metadata, a wrong value, the field our error must name)
TOP_FIELDS = [
    ("format_version", 2), ("cache_type", "relax.vm.Other"), ("page_size", 8), ("num_layers", 3),
    ("layer_begin", 0), ("layer_end", 4), ("num_qo_heads", 8), ("num_kv_heads", 4), ("qk_head_dim", 64),
    ("v_head_dim", 64), ("dtype", "float32"), ("rope_mode", "inline"), ("rotary_scale", 0.5),
    ("rotary_theta", 500000.5), ("has_rope_ext_factors", True), ("support_sliding_window", True),
    ("support_layer_sliding_window", True), ("page_group_layout", "1,num_logical_pages,2,page_size"),
    ("reserved_num_seqs", 0), ("num_total_pages", 0), ("prefill_chunk_size", -1),
    ("layout_hash", "0123456789abcdef"), ("attn_kinds", ["mha"]), ("seq_id", 1), ("seq_length", -1),
    ("logical_pages", []), ("groups", []),
]
NESTED_FIELDS = [
    (("attn_kinds", 1), "mla", "metadata.attn_kinds[1]"),
    (("logical_pages", 0, "logical_page_index"), 1, "metadata.logical_pages[0].logical_page_index"),
    (("logical_pages", 1, "start_pos"), 5, "metadata.logical_pages[1].start_pos"),
    (("logical_pages", 1, "length"), 4, "metadata.logical_pages[1].length"),
    (("groups", 1, "group_index"), 0, "metadata.groups[1].group_index"),
    (("groups", 0, "layer_begin"), 0, "metadata.groups[0].layer_begin"),
    (("groups", 1, "layer_end"), 2, "metadata.groups[1].layer_end"),
    (("groups", 0, "num_logical_pages"), 3, "metadata.groups[0].num_logical_pages"),
    (("groups", 1, "dtype"), "float32", "metadata.groups[1].dtype"),
    (("groups", 0, "shape"), [1, 2, 2, 2, 4], "metadata.groups[0].shape"),
    (("groups", 1, "shape", 3), 4, "metadata.groups[1].shape[3]"),
    (("groups", 0, "shape", 5), 64, "metadata.groups[0].shape[5]"),
    (("groups", 1, "nbytes"), 2 * PAGE_BYTES + 2, "metadata.groups[1].nbytes"),
]


def at(doc: Any, keys: tuple) -> tuple:
    """The index path of a key/index path like ("groups", 1, "shape", 3)."""
    path = []
    for key in keys:
        if isinstance(doc, Obj):
            i = next(i for i, (k, _) in enumerate(doc) if k == key)
            doc = doc[i][1]
        else:
            i = key
            doc = doc[i]
        path.append(i)
    return tuple(path)


def explicit_examples() -> list:
    params = []
    for name, bad in TOP_FIELDS:
        params.append(pytest.param((name,), bad, f"metadata.{name}", id=f"{name}={bad!r}"))
        params.append(pytest.param((name,), None, f"metadata.{name}", id=f"{name}-missing"))
        if isinstance(bad, int) and not isinstance(bad, bool):
            params.append(pytest.param((name,), "4", f"metadata.{name}", id=f"{name}-as-string"))
    for keys, bad, field in NESTED_FIELDS:
        label = ".".join(map(str, keys))
        params.append(pytest.param(keys, bad, field, id=f"{label}={bad!r}"))
        if isinstance(keys[-1], str):
            params.append(pytest.param(keys, None, field, id=f"{label}-missing"))
    for name in ("page_size", "seq_id", "seq_length", "num_total_pages"):
        params.append(pytest.param((name,), Raw("4.0"), f"metadata.{name}", id=f"{name}-float-literal"))
    params.append(pytest.param(("groups", 0, "nbytes"), Raw("4096.0"), "metadata.groups[0].nbytes",
                               id="groups.0.nbytes-float-literal"))
    params.append(pytest.param(("groups", 1, "shape", 1), Raw("2.0"), "metadata.groups[1].shape[1]",
                               id="groups.1.shape.1-float-literal"))
    params.append(pytest.param(("seq_length",), 2**31, "metadata.seq_length", id="seq_length=2^31"))
    return params


@pytest.mark.parametrize("keys, bad, field", explicit_examples())
def test_each_field_tvm_checks_is_checked_by_ours_and_named(ours, oracle, base_text, keys, bad, field):
    doc = parse(base_text)
    path = at(doc, keys)
    if bad is None:  # delete the key
        del node(doc, path[:-1])[path[-1]]
    else:
        set_node(doc, path, bad)
    text = dumps(doc)
    assert not oracle(text), "TVM should reject this mutation (the example is wrong)"
    error = check_against_tvm(ours, oracle, text)
    assert error is not None and error.field == field, error


def test_layout_hash_mismatch_has_its_own_error_type(ours, oracle, base_text):
    doc = parse(base_text)
    put(doc, "layout_hash", "ffffffffffffffff")
    error = check_against_tvm(ours, oracle, dumps(doc))
    assert isinstance(error, LayoutHashMismatch) and error.field == "metadata.layout_hash"


def test_sequence_larger_than_this_cache_is_rejected_naming_seq_length(ours, oracle, base_text):
    doc = parse(base_text)
    n = (NUM_TOTAL_PAGES + 1) * PAGE_SIZE  # consistent metadata of a bigger source cache
    for key, value in consistent_pages(n, num_total_pages=NUM_TOTAL_PAGES + 5).items():
        put(doc, key, value)
    text = dumps(doc)
    assert not oracle(text)
    error = check_against_tvm(ours, oracle, text)
    assert error is not None and error.field == "metadata.seq_length"


def test_source_cache_too_small_for_sequence_is_rejected_naming_num_total_pages(ours, oracle, base_text):
    doc = parse(base_text)
    put(doc, "num_total_pages", 1)  # seq 0 needs 2 pages
    text = dumps(doc)
    assert not oracle(text)
    error = check_against_tvm(ours, oracle, text)
    assert error is not None and error.field == "metadata.num_total_pages"


UNREPRESENTABLE = [  # (literal, the field our error names)
    pytest.param("1e400", "metadata.extra", id="overflow"),
    pytest.param("-1e400", "metadata.extra", id="negative-overflow"),
    pytest.param("1e-400", "metadata.extra", id="underflow-to-zero"),
    pytest.param("4.9406564584124654e-324", "metadata.extra", id="smallest-subnormal"),
    pytest.param("2.2250738585072009e-308", "metadata.extra", id="largest-subnormal"),
    pytest.param("1" + "0" * 400, "metadata.extra", id="integer-beyond-double-range"),
    pytest.param("[1, [2, 1e999]]", "metadata.extra[1][1]", id="nested-overflow"),
    pytest.param('"\\ud800"', "metadata.extra", id="lone-high-surrogate"),
    pytest.param('"\\udc00"', "metadata.extra", id="lone-low-surrogate"),
    pytest.param('"a\\ud800b"', "metadata.extra", id="high-surrogate-without-low"),
    pytest.param('["x", {"y": "\\udfff"}]', "metadata.extra[1].y", id="nested-lone-surrogate"),
]


@pytest.mark.parametrize("literal, field", UNREPRESENTABLE)
def test_unrepresentable_value_in_an_unknown_key_is_rejected_like_tvm(ours, oracle, base_text, literal, field):
    text = base_text[:-1] + ',"extra":' + literal + "}"
    assert not oracle(text)
    error = check_against_tvm(ours, oracle, text)
    assert error is not None and error.field == field


def test_key_with_lone_surrogate_is_rejected_like_tvm(ours, oracle, base_text):
    text = base_text[:-1] + ',"x\\udbff":1}'
    assert not oracle(text)
    assert check_against_tvm(ours, oracle, text) is not None


def test_too_deeply_nested_metadata_is_rejected_with_a_metadata_error(ours, base_text):
    # Not given to TVM: its recursive parser may exhaust the C stack on this.
    text = base_text[:-1] + ',"extra":' + "[" * 100_000 + "]" * 100_000 + "}"
    with pytest.raises(KVCkptError) as info:
        ours.cache.prepare_import(0, text)
    assert isinstance(info.value, BadValueError) and info.value.field == "metadata"
    assert ours.state() == ours.snapshot


@pytest.mark.parametrize("literal", ['"\\ud83d\\ude00"', "0e-400", "2.2250738585072014e-308", "1e308",
                                     "123456789012345678901234567890", "NaN", "-Infinity", '"\\u0000"'])
def test_representable_value_in_an_unknown_key_is_accepted_like_tvm(ours, oracle, base_text, literal):
    text = base_text[:-1] + ',"extra":' + literal + "}"
    assert oracle(text)
    assert check_against_tvm(ours, oracle, text) is None


@pytest.mark.parametrize("name, literal", [
    pytest.param("rotary_scale", "1" + "0" * 400, id="rotary_scale-integer-beyond-double-range"),
    pytest.param("rotary_theta", "-1e400", id="rotary_theta-overflow"),
    pytest.param("rotary_scale", "1e-400", id="rotary_scale-underflow"),
])
def test_out_of_range_rotary_value_is_rejected_naming_it(ours, oracle, base_text, name, literal):
    doc = parse(base_text)
    put(doc, name, Raw(literal))
    text = dumps(doc)
    assert not oracle(text)
    error = check_against_tvm(ours, oracle, text)
    assert error is not None and error.field == f"metadata.{name}"


@pytest.mark.parametrize("name, literal", [("rotary_scale", "1"), ("rotary_theta", "10000"),
                                           ("rotary_theta", "1e4"), ("rotary_scale", "1.0e0")])
def test_integral_rotary_value_spelled_as_int_is_accepted_like_tvm(ours, oracle, base_text, name, literal):
    doc = parse(base_text)
    put(doc, name, Raw(literal))
    text = dumps(doc)
    assert oracle(text)
    assert check_against_tvm(ours, oracle, text) is None
