"""Wire compatibility with Apache TVM's real PagedAttentionKVCache, over a grid of layouts.

Each case drives TVM's cache (``tests/support/tvm_reference.py``, CPU) and ours (WebGPU)
through the same operations (add / append / fork / popn), then checks that

* both report the same layout hash and the same checkpoint metadata text,
* both export the same page-group bytes and hold the same K/V,
* TVM's checkpoint imported into ours gives TVM's K/V and re-exports TVM's bytes,
* our checkpoint imported into TVM re-exports our bytes and gives our K/V,
* after such a round trip, appending the same K/V to both keeps their exports identical.

K/V appended to ours are always what TVM *stored* (read back with TVM's
``debug_get_kv``): with rope_mode "normal" TVM rotates K before storing it.
TVM only checkpoints sequence 0, so every case checkpoints seq 0 (a plain
sequence, an interleaved one, a scattered one, a fork child or a fork parent).
"""

from __future__ import annotations

import asyncio
import json
import zlib
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

pytest.importorskip("tvm", reason="Apache TVM is not installed (CI installs it)")

from kvckpt_web import CacheLimits, KVLayout, PagedKVCache  # noqa: E402
from kvckpt_web.kv.scatter import scatter_free_pages  # noqa: E402

from support import tvm_reference as ref

ROPE_NAMES = {ref.ROPE_NONE: "none", ref.ROPE_NORMAL: "normal", ref.ROPE_INLINE: "inline"}
RESERVED_NUM_SEQS = 4
MAX_TOTAL_SEQ_LEN = 160
PREFILL_CHUNK_SIZE = 64


def run(coro: Any) -> Any:
    return asyncio.run(coro)


# --------------------------------------------------------------------------- cases

# A scenario is a tuple of steps, applied in order to both caches:
#   ("add", seq)  ("append", ((seq, n), ...))  ("fork", parent, child, pos)  ("popn", seq, n)  ("remove", seq)
# "append" is one forward pass; its (seq, n) pairs are the batch order.


def grow(n: int) -> tuple:
    """Sequence 0 of ``n`` tokens, appended as a prefill, then decode steps."""
    steps: list = [("add", 0)]
    if n >= 3:
        steps.append(("append", ((0, n - 2),)))
        n = 2
    steps += [("append", ((0, 1),))] * n
    return tuple(steps)


def interleaved(rounds: int, a: int, b: int) -> tuple:
    """Sequences 0 and 1 appended alternately (separate forwards, then joint ones in swapped batch order)."""
    steps: list = [("add", 0), ("add", 1)]
    for i in range(rounds):
        steps += [("append", ((0, a),)), ("append", ((1, b),))]
        steps.append(("append", ((1, 1), (0, 1)) if i % 2 else ((0, 1), (1, 1))))
    return tuple(steps)


def scattered(steps: tuple) -> tuple:
    """``steps`` on a cache of ours whose free pages all stand apart (TVM's cache runs ``steps`` alone)."""
    return (("scatter",),) + steps


def fork_child(parent_len: int, pos: int, child_more: int, parent_more: int) -> tuple:
    """Sequence 1 of ``parent_len`` tokens, forked at ``pos`` into seq 0; both then grow."""
    steps: list = [("add", 1), ("append", ((1, parent_len),)), ("fork", 1, 0, pos)]
    if child_more:
        steps.append(("append", ((0, child_more),)))
    if parent_more:
        steps.append(("append", ((1, parent_more),)))
    if child_more and parent_more:
        steps.append(("append", ((1, 1), (0, 1))))
    return tuple(steps)


def fork_parent(length: int, more: int, drop_child: bool = False) -> tuple:
    """Sequence 0 forked whole into seq 1; both grow; seq 0 (the parent) is checkpointed."""
    steps: list = [("add", 0), ("append", ((0, length),)), ("fork", 0, 1, -1),
                   ("append", ((1, more),)), ("append", ((0, more),)), ("append", ((0, 1), (1, 2)))]
    if drop_child:
        steps.append(("remove", 1))
    return tuple(steps)


@dataclass(frozen=True)
class Case:
    page_size: int
    steps: tuple
    dtype: str = "float16"
    num_qo_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 32
    rope: int = ref.ROPE_NORMAL
    rotary_scale: float = 1.0
    rotary_theta: float = 10000.0
    layer_begin: int = 0
    num_layers: int = 2
    transfer: str = "auto"

    def tvm_cache(self) -> ref.TVMCache:
        return ref.TVMCache(
            page_size=self.page_size, num_layers=self.num_layers, num_qo_heads=self.num_qo_heads,
            num_kv_heads=self.num_kv_heads, head_dim=self.head_dim, dtype=self.dtype,
            layer_begin=self.layer_begin, rope_mode=self.rope, rotary_scale=self.rotary_scale,
            rotary_theta=self.rotary_theta, reserved_num_seqs=RESERVED_NUM_SEQS,
            max_total_seq_len=MAX_TOTAL_SEQ_LEN, prefill_chunk_size=PREFILL_CHUNK_SIZE,
        )

    def our_cache(self, device: Any) -> PagedKVCache:
        layout = KVLayout(
            page_size=self.page_size, num_layers=self.num_layers, num_qo_heads=self.num_qo_heads,
            num_kv_heads=self.num_kv_heads, qk_head_dim=self.head_dim, dtype=self.dtype,
            layer_begin=self.layer_begin, rope_mode=ROPE_NAMES[self.rope],
            rotary_scale=self.rotary_scale, rotary_theta=self.rotary_theta,
        )
        limits = CacheLimits(reserved_num_seqs=RESERVED_NUM_SEQS, max_total_seq_len=MAX_TOTAL_SEQ_LEN,
                             prefill_chunk_size=PREFILL_CHUNK_SIZE)
        return PagedKVCache(device, layout, limits, transfer=self.transfer)


F16, F32 = "float16", "float32"
NONE, NORMAL, INLINE = ref.ROPE_NONE, ref.ROPE_NORMAL, ref.ROPE_INLINE

# A covering set, not a cartesian product: every dtype, page size (1, 4, 16), GQA ratio,
# head dim, RoPE mode, odd rotary values, layer_begin > 0 and transfer path appears with
# several sequence shapes.
CASES = {
    # --- sequence lengths around page boundaries: 0, 1, page-1, page, page+1, several pages
    "p4-len0-f16-none": Case(4, grow(0), rope=NONE),
    "p4-len1-f16-normal-scale0.1-theta500000.5-lb1": Case(
        4, grow(1), rotary_scale=0.1, rotary_theta=500000.5, layer_begin=1),
    "p4-len3-f32-inline-gqa8:2-d64": Case(4, grow(3), dtype=F32, rope=INLINE, num_qo_heads=8, head_dim=64),
    "p4-len4-f16-normal-mha-d128-copy": Case(4, grow(4), num_qo_heads=4, num_kv_heads=4, head_dim=128,
                                            transfer="copy"),
    "p4-len5-f32-normal-scale1e-7-kernel": Case(4, grow(5), dtype=F32, rotary_scale=1e-7, transfer="kernel"),
    "p4-len14-f16-normal-lb2-3layers": Case(4, grow(14), layer_begin=2, num_layers=3),
    "p1-len0-f32-inline": Case(1, grow(0), dtype=F32, rope=INLINE),
    "p1-len1-f16-normal-theta1e-7": Case(1, grow(1), rotary_theta=1.2345e-7),
    "p1-len2-f32-none-lb3-copy": Case(1, grow(2), dtype=F32, rope=NONE, layer_begin=3, transfer="copy"),
    "p1-len9-f16-normal-gqa6:3-d96-1layer": Case(1, grow(9), num_qo_heads=6, num_kv_heads=3, head_dim=96,
                                                 num_layers=1),
    "p16-len1-f32-normal-gqa4:1-d128": Case(16, grow(1), dtype=F32, num_qo_heads=4, num_kv_heads=1,
                                            head_dim=128),
    "p16-len15-f16-normal-gqa8:2-d64-theta500000.5": Case(16, grow(15), num_qo_heads=8, head_dim=64,
                                                         rotary_theta=500000.5),
    "p16-len16-f16-inline-theta2^53": Case(16, grow(16), rope=INLINE, rotary_theta=9007199254740992.0),
    "p16-len17-f32-normal-scale0.1-copy": Case(16, grow(17), dtype=F32, rotary_scale=0.1, transfer="copy"),
    "p16-len50-f16-none-d128-lb1-kernel": Case(16, grow(50), rope=NONE, head_dim=128, layer_begin=1,
                                              transfer="kernel"),
    "p4-len9-f16-normal-theta1e20-scale3": Case(4, grow(9), rotary_theta=1e20, rotary_scale=3.0),
    # --- physically interleaved pages (two sequences appended alternately)
    "interleaved-p4-f16-normal": Case(4, interleaved(4, 3, 2)),
    "interleaved-p4-f32-normal-gqa8:2-lb3-copy": Case(4, interleaved(3, 5, 4), dtype=F32, num_qo_heads=8,
                                                      layer_begin=3, transfer="copy"),
    "interleaved-p1-f32-none-kernel": Case(1, interleaved(3, 2, 1), dtype=F32, rope=NONE, transfer="kernel"),
    "interleaved-p16-f16-inline-d64": Case(16, interleaved(3, 7, 9), rope=INLINE, head_dim=64),
    "interleaved-p16-f16-normal-scale0.1-copy": Case(16, interleaved(2, 17, 15), rotary_scale=0.1,
                                                     transfer="copy"),
    # --- every page of ours apart (short sequences hold the pages between)
    "scattered-interleaved-p4-f16-normal": Case(4, scattered(interleaved(4, 3, 2))),
    "scattered-interleaved-p1-f32-none-kernel": Case(1, scattered(interleaved(3, 2, 1)), dtype=F32, rope=NONE,
                                                     transfer="kernel"),
    "scattered-interleaved-p16-f16-normal-copy": Case(16, scattered(interleaved(2, 17, 15)), transfer="copy"),
    # --- forks: the child (seq 0) or the parent (seq 0) is checkpointed
    "fork-child-midpage-p4-f16-normal": Case(4, fork_child(11, 6, 5, 3)),
    "fork-child-boundary-p4-f32-none-copy": Case(4, fork_child(12, 8, 2, 2), dtype=F32, rope=NONE,
                                                 transfer="copy"),
    "fork-child-at0-p4-f16-inline": Case(4, fork_child(7, 0, 6, 1), rope=INLINE),
    "fork-child-whole-p16-f16-normal-lb1": Case(16, fork_child(20, -1, 13, 4), layer_begin=1),
    "fork-child-p1-f32-normal-kernel": Case(1, fork_child(6, 4, 3, 2), dtype=F32, transfer="kernel"),
    "fork-parent-p4-f16-normal": Case(4, fork_parent(6, 3)),
    "fork-parent-p16-f32-inline-d128-child-removed": Case(16, fork_parent(18, 9, drop_child=True),
                                                          dtype=F32, rope=INLINE, head_dim=128),
    "fork-parent-p1-f16-none-gqa8:2": Case(1, fork_parent(3, 2), rope=NONE, num_qo_heads=8),
    # --- popn, then growth into the freed slots
    "popn-p4-f16-normal": Case(4, grow(10) + (("popn", 0, 7), ("append", ((0, 2),)))),
    "popn-to-empty-p16-f32-none": Case(16, grow(20) + (("popn", 0, 20), ("append", ((0, 3),))),
                                       dtype=F32, rope=NONE),
}
CASE_IDS = list(CASES)


# --------------------------------------------------------------------------- lockstep driver


class Lockstep:
    """Applies the same operations to a TVM cache and ours; appends to ours what TVM stored."""

    def __init__(self, tvm_cache: ref.TVMCache, ours: PagedKVCache, seed: int) -> None:
        self.tvm = tvm_cache
        self.ours = ours
        self.rng = np.random.default_rng(seed)

    def apply(self, step: tuple) -> None:
        op, *args = step
        if op == "append":
            self.append(dict(args[0]))
        elif op == "scatter":  # ours only: TVM holds at most reserved_num_seqs sequences
            scatter_free_pages(self.ours, first_id=1000)
        else:
            method = {"add": "add_sequence", "remove": "remove_sequence", "fork": "fork_sequence",
                      "popn": "popn"}[op]
            getattr(self.tvm, method)(*args)
            getattr(self.ours, method)(*args)

    def append(self, batch: dict[int, int]) -> None:
        """One forward pass appending ``batch[seq]`` random tokens to each sequence, in dict order."""
        t = self.tvm
        shape = lambda n: (t.num_layers, n, t.num_kv_heads, t.head_dim)  # noqa: E731
        starts = {seq: t.get_sequence_length(seq) for seq in batch}
        kv = {seq: (self.rng.standard_normal(shape(n)).astype(t.dtype),
                    self.rng.standard_normal(shape(n)).astype(t.dtype)) for seq, n in batch.items()}
        t.append(list(batch), kv)
        stored = {seq: t.debug_get_kv(seq, starts[seq], starts[seq] + n) for seq, n in batch.items()}
        self.ours.begin_forward(list(batch), list(batch.values()))
        for layer in range(t.num_layers):
            k = np.ascontiguousarray(np.concatenate([stored[s][0][layer] for s in batch], axis=0))
            v = np.ascontiguousarray(np.concatenate([stored[s][1][layer] for s in batch], axis=0))
            self.ours.append_kv(layer, k, v)
        self.ours.end_forward()


def tvm_kv(cache: ref.TVMCache, seq: int) -> tuple[np.ndarray, np.ndarray]:
    n = cache.get_sequence_length(seq)
    if n == 0:  # TVM's debug_get_kv refuses an empty range
        empty = np.empty((cache.num_layers, 0, cache.num_kv_heads, cache.head_dim), dtype=cache.dtype)
        return empty, empty.copy()
    return cache.debug_get_kv(seq, 0, n)


def our_kv(cache: PagedKVCache, seq: int) -> tuple[np.ndarray, np.ndarray]:
    k, v = run(cache.debug_get_kv(seq, 0, cache.get_sequence_length(seq)))
    return k.numpy(), v.numpy()


def our_groups(cache: PagedKVCache, seq: int = 0) -> list[bytes]:
    return [bytes(g) for g in run(cache.export_groups(seq))]


def assert_kv_equal(actual: tuple[np.ndarray, np.ndarray], expected: tuple[np.ndarray, np.ndarray]) -> None:
    for a, e, name in zip(actual, expected, "KV"):
        assert a.dtype == e.dtype and a.shape == e.shape, name
        np.testing.assert_array_equal(a.view(np.uint8), e.view(np.uint8), err_msg=f"{name} differs")


@dataclass
class Built:
    """Both caches after a case's operations, with seq 0's checkpoint from each."""

    case: Case
    tvm: ref.TVMCache
    ours: PagedKVCache
    tvm_hash: str
    our_hash: str
    tvm_metadata: str
    our_metadata: str
    tvm_groups: list[bytes]
    our_groups: list[bytes]
    tvm_kv: tuple[np.ndarray, np.ndarray]
    our_kv: tuple[np.ndarray, np.ndarray]
    seed: int


def build(device: Any, case_id: str) -> Built:
    case = CASES[case_id]
    seed = zlib.crc32(case_id.encode())
    pair = Lockstep(case.tvm_cache(), case.our_cache(device), seed)
    for step in case.steps:
        pair.apply(step)
    t, o = pair.tvm, pair.ours
    return Built(case, t, o, t.get_layout_hash(), o.get_layout_hash(), t.get_checkpoint_metadata(0),
                 o.get_checkpoint_metadata(0), t.export_groups(0), our_groups(o), tvm_kv(t, 0), our_kv(o, 0),
                 seed + 1)


@pytest.fixture(scope="module")
def built(device):
    """``built(case_id)``: the case's state, built once per module."""
    states: dict[str, Built] = {}

    def get(case_id: str) -> Built:
        if case_id not in states:
            states[case_id] = build(device, case_id)
        return states[case_id]

    yield get
    for state in states.values():
        state.ours.close()


@pytest.fixture
def fresh(device):
    """Factory of empty caches (ours closed after the test)."""
    made: list[PagedKVCache] = []

    def ours(case: Case) -> PagedKVCache:
        made.append(case.our_cache(device))
        return made[-1]

    yield ours
    for cache in made:
        cache.close()


case_ids = pytest.mark.parametrize("case_id", CASE_IDS)


# --------------------------------------------------------------------------- (a) same state, same wire text


@case_ids
def test_layout_hash_matches_tvm(built, case_id):
    state = built(case_id)
    assert state.our_hash == state.tvm_hash


@case_ids
def test_checkpoint_metadata_text_matches_tvm(built, case_id):
    state = built(case_id)
    assert state.our_metadata == state.tvm_metadata
    metadata = json.loads(state.tvm_metadata)
    assert metadata["seq_id"] == 0 and metadata["layout_hash"] == state.tvm_hash


@case_ids
def test_kv_after_same_operations_matches_tvm(built, case_id):
    state = built(case_id)
    assert state.ours.get_sequence_length(0) == state.tvm.get_sequence_length(0)
    assert_kv_equal(state.our_kv, state.tvm_kv)


@case_ids
def test_exported_page_groups_are_byte_identical_to_tvm(built, case_id):
    state = built(case_id)
    assert [len(g) for g in state.our_groups] == [len(g) for g in state.tvm_groups]
    for group, (ours, theirs) in enumerate(zip(state.our_groups, state.tvm_groups)):
        assert ours == theirs, f"page group {group} differs"


@pytest.mark.parametrize("case_id", [c for c in CASE_IDS if c.startswith("scattered")])
def test_scattered_cases_export_a_sequence_whose_pages_all_stand_apart(built, case_id):
    pages = built(case_id).ours.seqs.get(0).pages
    assert len(pages) > 1 and all(b - a > 1 for a, b in zip(pages, pages[1:]))


# --------------------------------------------------------------------------- (b) TVM -> ours


@case_ids
def test_tvm_checkpoint_imported_into_ours_gives_tvm_kv(built, fresh, case_id):
    state = built(case_id)
    target = fresh(state.case)
    run(target.load_checkpoint(state.tvm_metadata, state.tvm_groups))
    assert target.get_sequence_length(0) == state.tvm.get_sequence_length(0)
    assert_kv_equal(our_kv(target, 0), state.tvm_kv)


@case_ids
def test_tvm_checkpoint_imported_into_ours_reexports_identically(built, fresh, case_id):
    state = built(case_id)
    target = fresh(state.case)
    run(target.load_checkpoint(state.tvm_metadata, state.tvm_groups))
    assert target.get_checkpoint_metadata(0) == state.tvm_metadata
    assert our_groups(target) == state.tvm_groups


# --------------------------------------------------------------------------- (c) ours -> TVM


@case_ids
def test_our_checkpoint_imported_into_tvm_reexports_identically(built, case_id):
    state = built(case_id)
    target = state.case.tvm_cache()
    target.import_checkpoint(state.our_metadata, state.our_groups)
    assert target.get_checkpoint_metadata(0) == state.our_metadata
    assert target.export_groups(0) == state.our_groups


@case_ids
def test_our_checkpoint_imported_into_tvm_gives_our_kv(built, case_id):
    state = built(case_id)
    target = state.case.tvm_cache()
    target.import_checkpoint(state.our_metadata, state.our_groups)
    assert_kv_equal(tvm_kv(target, 0), state.our_kv)


# --------------------------------------------------------------------------- (d) growth after a round trip


@case_ids
def test_appending_after_round_trip_keeps_exports_identical(built, fresh, case_id):
    state = built(case_id)
    tvm_target = state.case.tvm_cache()
    tvm_target.import_checkpoint(state.our_metadata, state.our_groups)
    our_target = fresh(state.case)
    run(our_target.load_checkpoint(state.tvm_metadata, state.tvm_groups))

    pair = Lockstep(tvm_target, our_target, state.seed)
    page = state.case.page_size
    pair.append({0: page + 1})  # crosses at least one page boundary
    pair.append({0: 1})
    tvm_target.add_sequence(1)
    our_target.add_sequence(1)
    pair.append({1: 2, 0: 1})  # a joint forward with a new sequence

    assert our_target.get_checkpoint_metadata(0) == tvm_target.get_checkpoint_metadata(0)
    assert our_groups(our_target) == tvm_target.export_groups(0)
    assert_kv_equal(our_kv(our_target, 0), tvm_kv(tvm_target, 0))
