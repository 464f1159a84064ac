"""Change tracking for incremental checkpoints: which leading tokens of a sequence are unchanged since a snapshot.

Pure bookkeeping (SequenceTable), no device.
"""

from __future__ import annotations

from kvckpt_web.kv.pool import SequenceTable

P = 4  # page size


def table() -> SequenceTable:
    return SequenceTable(64, P)


def grown(t: SequenceTable, seq_id: int, n: int) -> None:
    t.add(seq_id)
    if n:
        t.reserve([seq_id], [n])


def test_appends_leave_every_saved_token_unchanged():
    t = table()
    grown(t, 0, 10)
    since = t.get(0).state()
    t.reserve([0], [7])
    assert t.get(0).unchanged_prefix(since) == 10


def test_a_pop_lowers_the_unchanged_prefix_to_the_popped_length():
    t = table()
    grown(t, 0, 10)
    since = t.get(0).state()
    t.popn(0, 3)
    t.reserve([0], [5])
    assert t.get(0).unchanged_prefix(since) == 7


def test_the_lowest_of_several_pops_counts():
    t = table()
    grown(t, 0, 20)
    since = t.get(0).state()
    t.popn(0, 2)
    t.popn(0, 6)
    t.reserve([0], [9])
    t.popn(0, 1)
    assert t.get(0).unchanged_prefix(since) == 12


def test_pops_before_the_snapshot_do_not_count():
    t = table()
    grown(t, 0, 20)
    t.popn(0, 15)
    t.reserve([0], [10])
    since = t.get(0).state()
    t.popn(0, 1)
    assert t.get(0).unchanged_prefix(since) == 14


def test_a_pop_of_zero_tokens_changes_nothing():
    t = table()
    grown(t, 0, 9)
    since = t.get(0).state()
    t.popn(0, 0)
    assert t.get(0).state() == since
    assert t.get(0).unchanged_prefix(since) == 9


def test_every_snapshot_sees_exactly_the_pops_after_it():
    t = table()
    grown(t, 0, 40)
    lengths = [40]
    snapshots = [t.get(0).state()]
    for pop, grow in [(5, 2), (10, 1), (3, 9), (20, 4), (1, 1), (2, 30)]:
        t.popn(0, pop)
        lengths.append(t.get(0).length)
        t.reserve([0], [grow])
        snapshots.append(t.get(0).state())
        lengths.append(t.get(0).length)
    seq = t.get(0)
    # snapshot i was taken at lengths[2i]; every later length (popped-to or grown-to) bounds what is unchanged
    for i, since in enumerate(snapshots):
        assert seq.unchanged_prefix(since) == min(lengths[2 * i:])


def test_a_removed_and_added_again_sequence_is_another_sequence():
    t = table()
    grown(t, 0, 8)
    since = t.get(0).state()
    t.remove(0)
    grown(t, 0, 8)
    assert t.get(0).uid != since.uid
    assert t.get(0).unchanged_prefix(since) == 0


def test_a_fork_child_is_a_new_sequence():
    t = table()
    grown(t, 0, 8)
    t.fork(0, 1)
    assert t.get(1).uid != t.get(0).uid
    assert t.get(1).unchanged_prefix(t.get(0).state()) == 0


def test_a_fork_leaves_the_parent_unchanged():
    t = table()
    grown(t, 0, 10)
    since = t.get(0).state()
    t.fork(0, 1, 6)
    t.reserve([1], [3])
    assert t.get(0).state() == since
    assert t.get(0).unchanged_prefix(since) == 10


def test_a_replaced_sequence_is_another_sequence():
    t = table()
    grown(t, 0, 8)
    since = t.get(0).state()
    t.replace(0, 8)
    assert t.get(0).unchanged_prefix(since) == 0


def test_tracking_never_affects_sequence_equality():
    t = table()
    grown(t, 0, 8)
    grown(t, 1, 8)
    a, b = t.get(0), t.get(1)
    b.seq_id = a.seq_id
    b.pages = list(a.pages)
    assert a == b and a.uid != b.uid


def test_the_pop_history_stays_bounded_by_the_sequence_length():
    t = table()
    grown(t, 0, 4)
    for _ in range(200):  # speculative decoding: pop one, append two, over and over
        t.popn(0, 1)
        t.reserve([0], [2])
    for _ in range(2000):  # or pop one, append one
        t.popn(0, 1)
        t.reserve([0], [1])
    assert len(t.get(0)._floors) <= t.get(0).length + 1
