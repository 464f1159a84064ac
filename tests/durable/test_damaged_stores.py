"""Damaged stores: every bit flip, truncation, extension, deletion or swap of a manifest or chunk is detected;
a later save repairs a damaged chunk it reuses, and gc keeps an older generation behind a damaged newest one.

A store holds three checkpoints (two generations of one name, one of a forked
sequence under another name, sharing chunks). Each case damages one copy of it;
then every checkpoint that uses the damaged object must fail to restore with a
:class:`KVCkptError` whose message names the damaged key, ``verify`` must report
it, and the target cache must be exactly as before and still usable. Hundreds of
cases, cheap: a rejected restore never reaches the GPU.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from kvckpt_web import PagedKVCache
from kvckpt_web.errors import CorruptionError, FormatError, KVCkptError, NotFoundError
from kvckpt_web.durable.catalog import list_generations
from kvckpt_web.durable.restore import restore
from kvckpt_web.durable.retention import gc
from kvckpt_web.durable.save import save
from kvckpt_web.durable.verify import verify
from kvckpt_web.stores.memory import MemoryStore

from support.kvmodel import KVModel, run, small_layout, small_limits

LIMITS = small_limits(max_total_seq_len=256, prefill_chunk_size=256)
PPC = 2


@dataclass
class Pristine:
    data: dict[str, bytes]
    expected: dict[str, list[bytes]]  # manifest key -> exported groups
    uses: dict[str, set[str]]  # manifest key -> chunk keys

    @property
    def manifests(self) -> list[str]:
        return sorted(self.expected)

    @property
    def chunks(self) -> list[str]:
        return sorted(k for k in self.data if k.startswith("chunks/"))

    def users(self, chunk: str) -> list[str]:
        return [m for m in self.manifests if chunk in self.uses[m]]


@pytest.fixture(scope="module")
def pristine(device) -> Pristine:
    cache = PagedKVCache(device, small_layout(), LIMITS, transfer="kernel")
    try:
        model = KVModel(cache, seed=11)
        store = MemoryStore()
        expected = {}

        def checkpoint(name: str, seq: int) -> None:
            result = run(save(cache, seq, store, name, app_state={"seq": seq}, pages_per_chunk=PPC, keep=5))
            expected[result.key] = model.expected_groups(seq)

        model.add(0, 45)
        checkpoint("alpha", 0)
        model.append({0: 10})
        checkpoint("alpha", 0)
        model.fork(0, 1, 32)
        model.append({1: 7})
        checkpoint("beta", 1)
        uses = {info.key: set(info.chunk_keys) for info in run(list_generations(store))}
        return Pristine(dict(store._data), expected, uses)
    finally:
        cache.close()


@pytest.fixture(scope="module")
def target(device) -> PagedKVCache:
    """A cache that every rejected restore must leave exactly as it is: two sequences with data."""
    cache = PagedKVCache(device, small_layout(), LIMITS, transfer="kernel")
    model = KVModel(cache, seed=12)
    model.add(0, 9)
    model.add(1, 22)
    yield cache
    cache.close()


def snapshot(cache: PagedKVCache) -> tuple:
    # get_sequence_length raises while an import is pending, so this also proves none is left behind
    return tuple((s, cache.sequence_state(s), cache.get_sequence_length(s)) for s in cache.sequence_ids()), \
        cache.get_num_available_pages()


Damage = Callable[[dict[str, bytes]], None]


def flip(key: str, bit: int) -> Damage:
    def damage(data: dict[str, bytes]) -> None:
        raw = bytearray(data[key])
        raw[bit // 8] ^= 1 << (bit % 8)
        data[key] = bytes(raw)
    return damage


def resize(key: str, length: int) -> Damage:
    def damage(data: dict[str, bytes]) -> None:
        raw = data[key]
        data[key] = raw[:length] if length <= len(raw) else raw + bytes(range(length - len(raw)))
    return damage


def delete(key: str) -> Damage:
    def damage(data: dict[str, bytes]) -> None:
        del data[key]
    return damage


def swap(a: str, b: str) -> Damage:
    def damage(data: dict[str, bytes]) -> None:
        data[a], data[b] = data[b], data[a]
    return damage


def check_rejected(pristine: Pristine, target: PagedKVCache, damage: Damage, damaged: list[str],
                   affected: list[str], errors: tuple[type, ...] = (CorruptionError, FormatError)) -> list[str]:
    """Apply ``damage`` to a copy of the store; every ``affected`` manifest must fail naming a ``damaged`` key.

    Returns what went wrong (empty if all is as it must be).
    """
    data = dict(pristine.data)
    damage(data)
    store = MemoryStore(data)
    wrong = []
    before = snapshot(target)
    for key in affected:
        name, generation = key.split("/")[1], int(key.split("/")[2])
        try:
            run(restore(store, name, target, generation=generation, seq_id=0))
            wrong.append(f"{key}: restored although damaged")
        except errors as exc:
            if not any(d in str(exc) for d in damaged):
                wrong.append(f"{key}: error does not name {damaged}: {exc}")
        except KVCkptError as exc:
            wrong.append(f"{key}: unexpected {type(exc).__name__}: {exc}")
        if snapshot(target) != before:
            wrong.append(f"{key}: the target cache changed")
    report = run(verify(store))
    if report.ok or not any(d in p for p in report.problems for d in damaged):
        wrong.append(f"verify did not report {damaged}: {report.problems}")
    return wrong


def run_cases(pristine: Pristine, target: PagedKVCache, cases: Iterator[tuple[str, Damage, list[str], list[str]]],
              **kwargs: Any) -> int:
    failures, count = [], 0
    for label, damage, damaged, affected in cases:
        count += 1
        failures += [f"{label}: {w}" for w in check_rejected(pristine, target, damage, damaged, affected, **kwargs)]
    assert not failures, "\n".join(failures[:20])
    return count


# ----- manifests ---------------------------------------------------------------------------------------


def test_every_bit_flip_in_a_manifest_is_detected(pristine, target):
    def cases():
        for key in pristine.manifests:
            size = len(pristine.data[key])
            positions = list(range(0, 16 * 8, 3))  # header: magic, version, body length
            positions += [b * 8 + b % 8 for b in range(16, size - 32, max(1, (size - 48) // 40))]  # body
            positions += [(size - 32) * 8, (size - 1) * 8 + 7]  # checksum
            for bit in positions:
                yield f"{key} bit {bit}", flip(key, bit), [key], [key]

    assert run_cases(pristine, target, cases()) > 150


def test_every_truncation_or_extension_of_a_manifest_is_detected(pristine, target):
    def cases():
        for key in pristine.manifests:
            size = len(pristine.data[key])
            for length in (0, 1, 8, 15, 16, 47, size // 2, size - 32, size - 1, size + 1, size + 32):
                yield f"{key} resized to {length}", resize(key, length), [key], [key]

    assert run_cases(pristine, target, cases()) == 33


def test_a_deleted_manifest_is_reported_missing(pristine, target):
    def cases():
        for key in pristine.manifests:
            yield f"{key} deleted", delete(key), [key], [key]

    # verify cannot report what is not there: check restore only
    for label, damage, damaged, affected in cases():
        data = dict(pristine.data)
        damage(data)
        name, generation = damaged[0].split("/")[1], int(damaged[0].split("/")[2])
        with pytest.raises(NotFoundError, match=damaged[0]):
            run(restore(MemoryStore(data), name, target, generation=generation))


def test_swapped_manifests_are_detected(pristine, target):
    def cases():
        keys = pristine.manifests
        for i, a in enumerate(keys):
            for b in keys[i + 1:]:
                yield f"{a} <-> {b}", swap(a, b), [a, b], [a, b]

    assert run_cases(pristine, target, cases()) == 3


def test_a_manifest_copied_over_another_is_detected(pristine, target):
    def cases():
        for a in pristine.manifests:
            for b in pristine.manifests:
                if a != b:
                    def damage(data, a=a, b=b):
                        data[b] = data[a]
                    yield f"{a} copied over {b}", damage, [b], [b]

    assert run_cases(pristine, target, cases()) == 6


# ----- chunks ------------------------------------------------------------------------------------------


def test_every_bit_flip_in_a_chunk_is_detected(pristine, target):
    def cases():
        for key in pristine.chunks:
            size = len(pristine.data[key])
            for bit in (0, size * 4 + 3, size * 8 - 1):
                yield f"{key} bit {bit}", flip(key, bit), [key], pristine.users(key)

    assert run_cases(pristine, target, cases()) > 50


def test_every_truncation_or_extension_of_a_chunk_is_detected(pristine, target):
    def cases():
        for key in pristine.chunks:
            size = len(pristine.data[key])
            for length in (0, size - 1, size + 1):
                yield f"{key} resized to {length}", resize(key, length), [key], pristine.users(key)

    assert run_cases(pristine, target, cases()) > 50


def test_a_deleted_chunk_is_detected(pristine, target):
    def cases():
        for key in pristine.chunks:
            yield f"{key} deleted", delete(key), [key], pristine.users(key)

    assert run_cases(pristine, target, cases()) > 15


def test_swapped_chunks_are_detected(pristine, target):
    def cases():
        keys = pristine.chunks
        for a, b in zip(keys, keys[1:] + keys[:1]):
            yield f"{a} <-> {b}", swap(a, b), [a, b], sorted(set(pristine.users(a)) | set(pristine.users(b)))

    assert run_cases(pristine, target, cases()) > 15


# ----- damage is contained -----------------------------------------------------------------------------


def test_checkpoints_that_do_not_use_a_damaged_chunk_still_restore(pristine, target):
    only_alpha_1 = [k for k in pristine.chunks if pristine.users(k) == ["manifests/alpha/00000000000000000001"]]
    assert only_alpha_1
    data = dict(pristine.data)
    flip(only_alpha_1[0], 5)(data)
    store = MemoryStore(data)
    for key in ("manifests/alpha/00000000000000000002", "manifests/beta/00000000000000000001"):
        name, generation = key.split("/")[1], int(key.split("/")[2])
        result = run(restore(store, name, target, generation=generation, seq_id=3))
        assert [bytes(g) for g in run(target.export_groups(3))] == pristine.expected[key]
        assert result.app_state == {"seq": 0 if name == "alpha" else 1}
        target.remove_sequence(3)


def test_restore_of_the_newest_falls_back_to_nothing_when_it_is_damaged(pristine, target):
    data = dict(pristine.data)
    flip("manifests/alpha/00000000000000000002", 200)(data)
    with pytest.raises(CorruptionError, match="manifests/alpha/00000000000000000002: manifest checksum"):
        run(restore(MemoryStore(data), "alpha", target, seq_id=3))
    assert 3 not in target.sequence_ids()


def test_the_target_cache_is_usable_after_every_rejection(pristine, target):
    before = snapshot(target)
    data = dict(pristine.data)
    delete(pristine.chunks[0])(data)
    for key in pristine.users(pristine.chunks[0]):
        with pytest.raises(CorruptionError):
            run(restore(MemoryStore(data), key.split("/")[1], target, generation=int(key.split("/")[2])))
    assert snapshot(target) == before
    run(restore(MemoryStore(dict(pristine.data)), "beta", target, seq_id=2))
    assert [bytes(g) for g in run(target.export_groups(2))] == pristine.expected["manifests/beta/00000000000000000001"]
    target.begin_forward([2], [1])
    target.end_forward()
    target.remove_sequence(2)


# ----- a save over damaged chunks, gc over damaged manifests -------------------------------------------


ALPHA_2 = "manifests/alpha/00000000000000000002"
ALPHA_1 = "manifests/alpha/00000000000000000001"


def test_a_save_repairs_any_damaged_chunk_it_would_reuse(pristine, target):
    run(restore(MemoryStore(dict(pristine.data)), "alpha", target, seq_id=5))  # what alpha generation 2 holds
    count = 0
    try:
        for key in sorted(pristine.uses[ALPHA_2]):
            size = len(pristine.data[key])
            for label, damage in (("bit flip", flip(key, size * 4 + 1)), ("truncation", resize(key, size - 1)),
                                  ("emptied", resize(key, 0))):
                data = dict(pristine.data)
                damage(data)
                store = MemoryStore(data)  # a store object this process never wrote: every chunk is read back
                result = run(save(target, 5, store, "alpha", app_state={"seq": 0}, pages_per_chunk=PPC, keep=5))
                assert result.chunks_written == 1, f"{key} {label}"
                target.remove_sequence(5)
                run(restore(store, "alpha", target, seq_id=5))
                assert [bytes(g) for g in run(target.export_groups(5))] == pristine.expected[ALPHA_2], f"{key} {label}"
                assert run(verify(store)).ok, f"{key} {label}"
                count += 1
    finally:
        target.remove_sequence(5)
    assert count > 15


def test_gc_keep_1_behind_any_damage_to_the_newest_manifest_keeps_the_older_generation(pristine, target):
    size = len(pristine.data[ALPHA_2])
    cases = [flip(ALPHA_2, bit) for bit in range(0, size * 8, max(1, size * 8 // 60))]
    cases += [resize(ALPHA_2, n) for n in (0, 1, 16, size // 2, size - 1, size + 1)]
    for damage in cases:
        data = dict(pristine.data)
        damage(data)
        store = MemoryStore(data)
        result = run(gc(store, keep=1))
        assert ALPHA_1 in result.kept_manifests and result.kept_reasons[ALPHA_2].startswith("damaged")
        run(restore(store, "alpha", target, generation=1, seq_id=5))
        assert [bytes(g) for g in run(target.export_groups(5))] == pristine.expected[ALPHA_1]
        target.remove_sequence(5)
    assert len(cases) > 60
