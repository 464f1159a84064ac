"""Prefix index records and lookups (kvckpt_web.durable.prefix_records, prefix_index): record bytes, chained
page hashes, and an index in memory.

FORMAT.md section 7 is the specification; nothing here needs a GPU.
"""

from __future__ import annotations

import hashlib
import json

import pytest

from kvckpt_web.durable import prefix_records
from kvckpt_web.durable.prefix_index import PrefixHit, PrefixIndex
from kvckpt_web.durable.prefix_records import (MAX_RECORD_BYTES, PrefixKey, PrefixRecord, decode_record,
                                               encode_record, page_hashes, prefix_record, record_key, scope_id)
from kvckpt_web.errors import FieldError, FormatError, StoreError
from kvckpt_web.stores.memory import MemoryStore

from support.kvmodel import run

SCOPE = "model-a|layout-00ff|kernels-1"
PAGE = 4


def record(name: str, generation: int, tokens: list[int], scope: str = SCOPE, page_size: int = PAGE) -> PrefixRecord:
    return prefix_record(PrefixKey(scope, tuple(tokens)), name, generation, len(tokens), page_size)


def stored(store: MemoryStore, *records: PrefixRecord) -> None:
    for r in records:
        store._data[r.key] = encode_record(r)


def body(r: PrefixRecord) -> dict:
    return json.loads(encode_record(r))


# ----- format ------------------------------------------------------------------------------------------------


def test_a_record_encodes_to_its_pinned_bytes():
    r = record("chat-a", 3, list(range(1, 11)))
    assert r.key == "prefixes/55268077acb95acde3da13908e726ff6/chat-a/00000000000000000003"
    assert encode_record(r) == (
        b'{"format":"kvckpt.prefixes","generation":3,"name":"chat-a","page_size":4,'
        b'"pages":["fc396ee9e16a19cdedc8bb39618a17d1","0157128dbc882f6e8e1fa56416495266"],'
        b'"scope_id":"55268077acb95acde3da13908e726ff6","tokens":10,"version":1}')
    assert decode_record(r.key, encode_record(r)) == r


def test_page_hashes_chain_sha256_over_little_endian_u32_pages():
    tokens = [0, 1, 2**32 - 1, 49151, 7, 8, 9, 10, 11]
    h = hashlib.sha256(SCOPE.encode("utf-8")).digest()
    expected = []
    for page in (tokens[0:4], tokens[4:8]):  # the 9th token is a partial page: not hashed
        h = hashlib.sha256(h + b"".join(t.to_bytes(4, "little") for t in page)).digest()
        expected.append(h[:16].hex())
    assert page_hashes(SCOPE, tokens, PAGE) == expected


def test_equal_leading_pages_give_equal_leading_hashes_and_a_difference_changes_every_later_one():
    a = page_hashes(SCOPE, list(range(16)), PAGE)
    b = page_hashes(SCOPE, list(range(8)) + [99] + list(range(9, 16)), PAGE)
    assert a[:2] == b[:2]
    assert all(x != y for x, y in zip(a[2:], b[2:]))


def test_another_scope_gives_other_hashes_and_another_scope_id():
    assert page_hashes("model-b", list(range(8)), PAGE) != page_hashes(SCOPE, list(range(8)), PAGE)
    assert scope_id(SCOPE) == hashlib.sha256(SCOPE.encode()).hexdigest()[:32] != scope_id("model-b")


def test_record_keys_format_the_generation_as_manifests_do():
    assert record_key("0" * 32, "a", 7) == f"prefixes/{'0' * 32}/a/00000000000000000007"
    with pytest.raises(FieldError, match="name"):
        record_key("0" * 32, "..", 1)
    with pytest.raises(FieldError, match="scope_id"):
        record_key("0" * 31, "a", 1)


@pytest.mark.parametrize("scope, tokens, field", [
    ("", [1], "scope"),
    (7, [1], "scope"),
    (SCOPE, [1, True], r"prefix.tokens\[1\]"),
    (SCOPE, [1, -1], r"prefix.tokens\[1\]"),
    (SCOPE, [2**32], r"prefix.tokens\[0\]"),
    (SCOPE, [1.0], r"prefix.tokens\[0\]"),
    (SCOPE, "abc", "prefix.tokens"),
])
def test_a_prefix_key_refuses_what_cannot_be_hashed(scope, tokens, field):
    with pytest.raises(FieldError, match=field):
        PrefixKey(scope, tokens)


def _mutated(**changes) -> bytes:
    b = body(record("a", 2, list(range(9))))
    for k, v in changes.items():
        if v is KeyError:
            del b[k]
        else:
            b[k] = v
    return json.dumps(b).encode()


GOOD_KEY = record("a", 2, list(range(9))).key
BAD_RECORDS = {
    "oversize": b" " * (MAX_RECORD_BYTES + 1),
    "not UTF-8": b'{"format":"\xff"}',
    "byte-order mark": b"\xef\xbb\xbf" + encode_record(record("a", 2, list(range(9)))),
    "not JSON": b'{"format":',
    "nested deeper": _mutated(pages=[["0" * 32], ["0" * 32]]),
    "not an object": b"[]",
    "duplicate key": encode_record(record("a", 2, list(range(9))))[:-1] + b',"version":1}',
    "another format": _mutated(format="other"),
    "another version": _mutated(version=2),
    "version as a bool": _mutated(version=True),
    "an unknown key": _mutated(extra=1),
    "a missing key": _mutated(tokens=KeyError),
    "another scope than its key": _mutated(scope_id="0" * 32),
    "another name than its key": _mutated(name="b"),
    "another generation than its key": _mutated(generation=3),
    "generation as a string": _mutated(generation="2"),
    "page_size 0": _mutated(page_size=0),
    "negative tokens": _mutated(tokens=-1),
    "fewer pages than tokens // page_size": _mutated(tokens=12),
    "a page hash of capitals": _mutated(pages=["A" * 32, "0" * 32]),
    "a page hash too short": _mutated(pages=["0" * 30, "0" * 32]),
}


@pytest.mark.parametrize("data", BAD_RECORDS.values(), ids=BAD_RECORDS.keys())
def test_a_reader_rejects_a_record_that_breaks_a_rule(data):
    with pytest.raises(FormatError, match=GOOD_KEY):
        decode_record(GOOD_KEY, data)


def test_a_writer_refuses_a_record_a_reader_would_reject(monkeypatch):
    with pytest.raises(FormatError, match="pages"):
        encode_record(PrefixRecord(scope_id(SCOPE), "a", 1, PAGE, 9, ("0" * 32,)))
    monkeypatch.setattr(prefix_records, "MAX_RECORD_BYTES", 100)
    with pytest.raises(FormatError, match="length"):
        encode_record(record("a", 1, list(range(9))))


# ----- lookups -----------------------------------------------------------------------------------------------


def index_of(store: MemoryStore) -> PrefixIndex:
    index = PrefixIndex(store, SCOPE, PAGE)
    run(index.refresh())
    return index


def test_lookup_returns_every_name_sharing_a_page_longest_match_first():
    prompt = list(range(40))
    store = MemoryStore()
    stored(store, record("two-pages", 1, prompt[:8] + [500] * 9), record("five-pages", 1, prompt[:21]),
           record("other", 1, [7] * 40), record("first-differs", 1, [99] + prompt[1:]))
    hits = index_of(store).lookup(prompt + [1, 2])
    assert hits == [PrefixHit("five-pages", 1, 5, 21, PAGE), PrefixHit("two-pages", 1, 2, 17, PAGE)]
    assert hits[0].matched_tokens == 20


def test_lookup_orders_equal_matches_by_newest_generation_then_name():
    prompt = list(range(12))
    store = MemoryStore()
    stored(store, *(record(n, g, prompt) for n, g in (("b", 1), ("a", 1), ("c", 4), ("b", 2))))
    hits = index_of(store).lookup(prompt)
    assert [(h.name, h.generation) for h in hits] == [("c", 4), ("b", 2), ("a", 1), ("b", 1)]


def test_lookup_counts_only_full_pages_of_the_prompt():
    store = MemoryStore()
    stored(store, record("a", 1, list(range(12))))
    index = index_of(store)
    assert index.lookup(list(range(3))) == []
    assert [h.pages for h in index.lookup(list(range(7)))] == [1]


def test_lookup_never_matches_another_scope():
    store = MemoryStore()
    stored(store, record("a", 1, list(range(12)), scope="model-b"))
    assert index_of(store).lookup(list(range(12))) == []


def test_lookup_reads_nothing_from_the_store():
    store = MemoryStore()
    stored(store, record("a", 1, list(range(12))))
    index = index_of(store)
    store._data.clear()
    assert [h.name for h in index.lookup(list(range(12)))] == ["a"]


class CountingReads(MemoryStore):
    def __init__(self) -> None:
        super().__init__()
        self.reads: list[str] = []

    async def _get(self, key: str) -> bytes | None:
        self.reads.append(key)
        return await super()._get(key)


def test_refresh_reads_each_record_once():
    store = CountingReads()
    first, second = record("a", 1, list(range(12))), record("b", 1, list(range(8)))
    stored(store, first)
    index = PrefixIndex(store, SCOPE, PAGE)
    assert run(index.refresh()) == 1
    stored(store, second)
    assert run(index.refresh()) == 1
    assert run(index.refresh()) == 0
    assert sorted(store.reads) == sorted([first.key, second.key])


def test_refresh_forgets_records_no_longer_stored():
    store = MemoryStore()
    stored(store, record("a", 1, list(range(12))), record("b", 1, list(range(12))))
    index = index_of(store)
    del store._data[record("a", 1, list(range(12))).key]
    run(index.refresh())
    assert [h.name for h in index.lookup(list(range(12)))] == ["b"] and len(index) == 1


@pytest.mark.parametrize("data", BAD_RECORDS.values(), ids=BAD_RECORDS.keys())
def test_lookup_ignores_a_record_a_reader_rejects(data):
    store = MemoryStore()
    good = record("b", 1, list(range(9)))
    stored(store, good)
    store._data[GOOD_KEY] = data
    index = index_of(store)
    assert [h.name for h in index.lookup(list(range(9)))] == ["b"]
    assert list(index.ignored) == [GOOD_KEY]


def test_lookup_ignores_records_of_another_page_size():
    store = MemoryStore()
    stored(store, record("a", 1, list(range(16)), page_size=8), record("b", 1, list(range(16))))
    index = index_of(store)
    assert [h.name for h in index.lookup(list(range(16)))] == ["b"]
    assert "page_size 8" in index.ignored[record("a", 1, list(range(16)), page_size=8).key]


def test_refresh_tries_again_a_record_it_could_not_read():
    class Failing(MemoryStore):
        fail = True

        async def _get(self, key: str) -> bytes | None:
            if self.fail:
                raise StoreError(f"get {key!r}: I/O error")
            return await super()._get(key)

    store = Failing()
    stored(store, record("a", 1, list(range(12))))
    index = index_of(store)
    assert len(index) == 0 and index.ignored == {}
    store.fail = False
    run(index.refresh())
    assert [h.name for h in index.lookup(list(range(12)))] == ["a"]


def test_note_adds_a_just_committed_record_without_reading_it():
    store = CountingReads()
    r = record("a", 1, list(range(12)))
    stored(store, r)
    index = PrefixIndex(store, SCOPE, PAGE)
    index.note(r)
    assert [h.name for h in index.lookup(list(range(12)))] == ["a"]
    assert run(index.refresh()) == 0 and store.reads == []


def test_note_refuses_a_record_of_another_scope():
    index = PrefixIndex(MemoryStore(), SCOPE, PAGE)
    with pytest.raises(FieldError, match="scope_id"):
        index.note(record("a", 1, list(range(12)), scope="model-b"))
    assert len(index) == 0


def test_lookup_with_a_limit_returns_only_the_longest_matches():
    prompt = list(range(40))
    store = MemoryStore()
    shared = [record(f"short-{i}", 1, prompt[:4] + [500 + i] * 8) for i in range(50)]  # one page, as a system prompt
    stored(store, record("long", 1, prompt[:21]), record("mid", 1, prompt[:9]), *shared)
    index = index_of(store)
    assert [(h.name, h.pages) for h in index.lookup(prompt, limit=2)] == [("long", 5), ("mid", 2)]
    assert len(index.lookup(prompt)) == 52 and index.lookup(prompt)[:2] == index.lookup(prompt, limit=2)


@pytest.mark.parametrize("limit", [0, -1, 1.5, True])
def test_lookup_refuses_a_limit_that_is_no_positive_integer(limit):
    with pytest.raises(FieldError, match="limit"):
        index_of(MemoryStore()).lookup(list(range(8)), limit=limit)
