"""Page pool and sequence table: pure bookkeeping, no device."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvckpt_web.errors import CapacityError, SequenceError
from kvckpt_web.kv.pool import PagePool, SequenceTable

P = 4  # page size used throughout


def table(num_pages: int = 8) -> SequenceTable:
    return SequenceTable(num_pages, P)


def snapshot(t: SequenceTable) -> tuple:
    """Everything observable about a table: each sequence's length and pages, the free count, shared pages."""
    seqs = {s: (q.length, list(q.pages)) for s, q in t.seqs.items()}
    shared = [p for p in range(t.pool.num_pages) if t.pool.is_shared(p)]
    return seqs, t.pool.num_free, shared


def grown(t: SequenceTable, seq_id: int, n: int) -> list[int]:
    """Add ``seq_id`` and reserve ``n`` tokens for it; the positions."""
    t.add(seq_id)
    return t.reserve([seq_id], [n]) if n else []


# ----- PagePool ------------------------------------------------------------------------------------


def test_new_pool_has_every_page_free():
    assert PagePool(5).num_free == 5


def test_first_allocation_starts_at_page_zero():
    assert PagePool(6).allocate(3) == [0, 1, 2]


def test_allocate_after_a_page_continues_right_behind_it():
    pool = PagePool(8)
    pool.allocate(2)
    assert pool.allocate(2, after=1) == [2, 3]


def test_allocate_after_a_page_whose_next_page_is_used_starts_a_new_run():
    pool = PagePool(9)
    pool.allocate(2)  # pages 0, 1
    assert pool.allocate(1, after=0) == [5]  # page 1 is used: past the middle of the free run 2..8


def test_allocate_after_freed_pages_reuses_them_merged_with_the_free_run_behind():
    pool = PagePool(10)
    pool.allocate(4)  # 0..3
    pool.release([2, 3])
    assert pool.allocate(3, after=1) == [2, 3, 4]


def test_allocate_after_the_last_page_starts_a_new_run():
    pool = PagePool(10)
    pool.allocate(5)
    assert pool.allocate(1, after=9) == [7]  # past the middle of the free run 5..9


def test_allocation_behind_a_used_page_starts_past_the_middle_of_the_free_run():
    pool = PagePool(9)
    pool.allocate(1)
    assert pool.allocate(1) == [5]  # free run 1..8: its first half stays for page 0's owner


def test_allocation_that_fills_more_than_half_a_run_ends_at_the_runs_end():
    pool = PagePool(10)
    pool.allocate(1)
    assert pool.allocate(6) == [4, 5, 6, 7, 8, 9]


def test_allocation_larger_than_any_run_takes_the_largest_runs_first():
    pool = PagePool(10)
    pool.allocate(10)
    pool.release([1, 3, 4, 5, 7, 8])  # free runs 1, 3..5, 7..8
    assert pool.allocate(5) == [3, 4, 5, 7, 8]
    assert pool.allocate(1) == [1]


def test_equal_runs_are_taken_lowest_page_first():
    pool = PagePool(8)
    pool.allocate(8)
    pool.release([6, 2, 4])
    assert pool.allocate(3) == [2, 4, 6]


def test_freed_pages_merge_with_both_neighbours_into_one_run():
    pool = PagePool(6)
    pool.allocate(6)
    pool.release([1, 3, 2])
    assert pool.allocate(3) == [1, 2, 3]
    assert pool.num_free == 0


def test_allocate_is_all_or_nothing():
    pool = PagePool(4)
    pool.allocate(3)
    with pytest.raises(CapacityError, match="expected 2 free pages, got 1"):
        pool.allocate(2)
    assert pool.num_free == 1
    assert pool.allocate(1) == [3]


def test_allocate_zero_pages_returns_nothing():
    pool = PagePool(2)
    assert pool.allocate(0) == []
    assert pool.num_free == 2


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 6), st.integers(-1, 15)), max_size=40))
def test_allocate_and_release_hand_out_each_free_page_exactly_once(ops):
    pool, used = PagePool(16), []
    for allocating, n, after in ops:
        if allocating and n <= pool.num_free:
            pages = pool.allocate(n, after=None if after < 0 else after)
            assert len(pages) == n and not set(pages) & set(used) and len(set(pages)) == n
            used += pages
        elif not allocating and min(n, len(used)):
            k = min(n, len(used))
            pool.release(used[-k:])
            del used[-k:]
        assert pool.num_free == 16 - len(used)
    assert sorted(pool.allocate(pool.num_free) + used) == list(range(16))


def test_retained_page_stays_allocated_until_every_reference_is_released():
    pool = PagePool(2)
    (page,) = pool.allocate(1)
    assert not pool.is_shared(page)
    pool.retain([page])
    assert pool.is_shared(page)
    pool.release([page])
    assert not pool.is_shared(page)
    assert pool.num_free == 1  # still held once
    pool.release([page])
    assert pool.num_free == 2


# ----- SequenceTable: sequences ----------------------------------------------------------------------


def test_add_creates_an_empty_sequence_without_pages():
    t = table()
    seq = t.add(3)
    assert (seq.length, seq.pages) == (0, [])
    assert t.get(3) is seq
    assert t.pool.num_free == 8


@pytest.mark.parametrize("bad", [-1, True, 1.0, "0", None])
def test_add_refuses_ids_that_are_not_non_negative_integers(bad):
    with pytest.raises(SequenceError, match="non-negative integer"):
        table().add(bad)


def test_add_refuses_an_id_in_use():
    t = table()
    t.add(0)
    with pytest.raises(SequenceError, match="already exists"):
        t.add(0)


def test_get_unknown_sequence_raises_sequence_error():
    with pytest.raises(SequenceError, match="existing sequence"):
        table().get(9)


def test_remove_releases_the_sequences_pages():
    t = table()
    grown(t, 0, 9)  # 3 pages
    assert t.pool.num_free == 5
    t.remove(0)
    assert t.pool.num_free == 8
    assert 0 not in t.seqs


def test_clear_removes_every_sequence_and_frees_every_page():
    t = table()
    grown(t, 0, 5)
    grown(t, 1, 3)
    t.fork(0, 2, 4)
    t.clear()
    assert t.seqs == {}
    assert t.pool.num_free == 8


# ----- reserve ---------------------------------------------------------------------------------------


def test_reserve_returns_page_times_page_size_plus_slot_per_token():
    t = table()
    assert grown(t, 0, 6) == [0, 1, 2, 3, 4, 5]  # pages 0, 1
    assert grown(t, 1, 2) == [20, 21]  # page 5: past the middle of the free pages 2..7
    assert t.reserve([0], [3]) == [6, 7, 8]  # slots 2-3 of page 1, then page 2
    assert t.get(0).pages == [0, 1, 2]
    assert t.get(0).length == 9


def test_reserve_positions_follow_batch_order():
    t = table()
    t.add(0)
    t.add(1)
    assert t.reserve([1, 0], [2, 1]) == [0, 1, 16]
    assert t.get(1).pages == [0] and t.get(0).pages == [4]


def test_sequences_appended_in_turns_each_keep_one_run_of_pages():
    t = table(17)
    t.add(0)
    t.add(1)
    for _ in range(8):
        t.reserve([0, 1], [P, P])
    assert t.get(0).pages == list(range(0, 8))
    assert t.get(1).pages == list(range(9, 17))


def test_a_growing_sequence_blocked_by_another_continues_in_a_new_run():
    t = table(8)
    grown(t, 0, P)  # page 0
    grown(t, 1, P)  # page 4
    t.reserve([0], [4 * P])
    assert t.get(0).pages == [0, 1, 2, 3, 6]  # 1..3, then past the middle of 5..7


def test_reserve_fills_a_partial_last_page_before_taking_a_new_one():
    t = table()
    grown(t, 0, 1)
    assert t.reserve([0], [3]) == [1, 2, 3]
    assert t.pool.num_free == 7


def test_reserve_is_all_or_nothing_when_pages_run_out():
    t = table(3)
    grown(t, 0, 2)
    t.add(1)
    before = snapshot(t)
    with pytest.raises(CapacityError):
        t.reserve([0, 1], [2, 9])  # seq 0 fits in its page, seq 1 needs 3 new pages: only 2 are free
    assert snapshot(t) == before


def test_reserve_of_an_unknown_sequence_changes_nothing():
    t = table()
    grown(t, 0, 2)
    before = snapshot(t)
    with pytest.raises(SequenceError):
        t.reserve([0, 7], [1, 1])
    assert snapshot(t) == before


# ----- fork ------------------------------------------------------------------------------------------


def test_fork_at_page_boundary_shares_full_pages_without_copies():
    t = table()
    grown(t, 0, 10)  # pages 0, 1, 2 (2 tokens in page 2)
    assert t.fork(0, 1, 8) == []
    child = t.get(1)
    assert (child.length, child.pages) == (8, [0, 1])
    assert t.pool.is_shared(0) and t.pool.is_shared(1) and not t.pool.is_shared(2)


def test_fork_in_the_middle_of_a_page_copies_that_page_to_a_fresh_one():
    t = table()
    grown(t, 0, 10)
    copies = t.fork(0, 1, 6)
    assert copies == [(1, 5)]  # parent's page 1 -> fresh page 5, a new run in the free pages 3..7
    child = t.get(1)
    assert (child.length, child.pages) == (6, [0, 5])
    assert t.pool.is_shared(0) and not t.pool.is_shared(1) and not t.pool.is_shared(5)


def test_fork_of_the_whole_sequence_copies_a_partial_last_page():
    t = table()
    grown(t, 0, 5)
    assert t.fork(0, 1) == [(1, 5)]
    assert t.get(1).pages == [0, 5]
    assert t.get(1).length == 5


def test_fork_at_zero_gives_an_empty_child():
    t = table()
    grown(t, 0, 5)
    assert t.fork(0, 1, 0) == []
    assert (t.get(1).length, t.get(1).pages) == (0, [])


@pytest.mark.parametrize("pos", [-2, 6, True])
def test_fork_refuses_positions_outside_the_parent(pos):
    t = table()
    grown(t, 0, 5)
    before = snapshot(t)
    with pytest.raises(SequenceError, match="fork_pos"):
        t.fork(0, 1, pos)
    assert snapshot(t) == before


def test_fork_refuses_a_child_id_in_use():
    t = table()
    grown(t, 0, 5)
    t.add(1)
    before = snapshot(t)
    with pytest.raises(SequenceError, match="already exists"):
        t.fork(0, 1)
    assert snapshot(t) == before


def test_fork_needing_a_copy_with_no_free_page_changes_nothing():
    t = table(2)
    grown(t, 0, 5)  # both pages
    before = snapshot(t)
    with pytest.raises(CapacityError):
        t.fork(0, 1, 5)
    assert snapshot(t) == before


# ----- popn ------------------------------------------------------------------------------------------


def test_popn_within_an_unshared_page_needs_no_copy():
    t = table()
    grown(t, 0, 7)
    assert t.popn(0, 2) == []
    assert (t.get(0).length, t.get(0).pages) == (5, [0, 1])


def test_popn_releases_pages_past_the_new_end():
    t = table()
    grown(t, 0, 9)
    assert t.popn(0, 5) == []
    assert (t.get(0).length, t.get(0).pages) == (4, [0])
    assert t.pool.num_free == 7


def test_popn_of_everything_leaves_an_empty_sequence():
    t = table()
    grown(t, 0, 6)
    t.popn(0, 6)
    assert (t.get(0).length, t.get(0).pages) == (0, [])
    assert t.pool.num_free == 8


def test_popn_into_a_shared_page_copies_it_for_the_popped_sequence():
    t = table()
    grown(t, 0, 8)  # pages 0, 1 full
    t.fork(0, 1)  # child shares both
    copies = t.popn(1, 2)
    assert copies == [(1, 5)]
    assert t.get(1).pages == [0, 5]
    assert t.get(0).pages == [0, 1]  # the parent keeps its page
    assert not t.pool.is_shared(1) and t.pool.is_shared(0)


def test_popn_to_a_page_boundary_of_a_shared_page_needs_no_copy():
    t = table()
    grown(t, 0, 8)
    t.fork(0, 1)
    assert t.popn(1, 4) == []
    assert t.get(1).pages == [0]
    assert not t.pool.is_shared(1)  # the parent alone holds page 1 now


def test_popn_into_a_shared_page_with_no_free_page_changes_nothing():
    t = table(2)
    grown(t, 0, 8)  # both pages, full
    t.fork(0, 1)
    before = snapshot(t)
    with pytest.raises(CapacityError):
        t.popn(1, 1)
    assert snapshot(t) == before


@pytest.mark.parametrize("n", [-1, 6, True])
def test_popn_refuses_counts_outside_the_sequence(n):
    t = table()
    grown(t, 0, 5)
    before = snapshot(t)
    with pytest.raises(SequenceError):
        t.popn(0, n)
    assert snapshot(t) == before


# ----- replace ---------------------------------------------------------------------------------------


def test_replace_creates_a_sequence_on_fresh_pages():
    t = table()
    seq = t.replace(5, 9)
    assert (seq.length, seq.pages) == (9, [0, 1, 2])
    assert t.get(5) is seq


def test_replace_reuses_the_old_sequences_pages_in_the_capacity_check():
    t = table(4)
    grown(t, 0, 12)  # 3 of 4 pages
    seq = t.replace(0, 16)  # needs 4: 1 free + 3 reclaimable
    assert seq.length == 16 and len(seq.pages) == 4
    assert t.pool.num_free == 0


def test_replace_does_not_count_shared_pages_as_reclaimable():
    t = table(4)
    grown(t, 0, 8)  # pages 0, 1
    t.fork(0, 1)  # child shares them
    before = snapshot(t)
    with pytest.raises(CapacityError):
        t.replace(0, 13)  # needs 4 pages: 2 free, nothing reclaimable
    assert snapshot(t) == before


def test_replace_without_enough_pages_changes_nothing():
    t = table(4)
    grown(t, 0, 4)
    grown(t, 1, 4)
    before = snapshot(t)
    with pytest.raises(CapacityError):
        t.replace(1, 13)
    assert snapshot(t) == before


@pytest.mark.parametrize("bad", [-1, True, "1"])
def test_replace_refuses_bad_ids(bad):
    with pytest.raises(SequenceError):
        table().replace(bad, 1)
