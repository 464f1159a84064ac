"""A scattered page table: the worst case for moving a sequence's pages, which benchmarks and tests build."""

from __future__ import annotations

from .cache import PagedKVCache


def scatter_free_pages(cache: PagedKVCache, first_id: int) -> None:
    """Hold every other free page with a one-token sequence (ids from ``first_id``), so that the pages a
    sequence gets from now on all stand apart: the worst page table, as many short sequences leave it."""
    ids = list(range(first_id, first_id + cache.get_num_available_pages()))
    batch = min(cache.limits.reserved_num_seqs, cache.limits.prefill_chunk_size)
    for at in range(0, len(ids), batch):
        step = ids[at:at + batch]
        for seq in step:
            cache.add_sequence(seq)
        cache.begin_forward(step, [1] * len(step))  # a page each; their K/V are never read
        cache.end_forward()
    for seq in ids:
        if cache.seqs.get(seq).pages[0] % 2:
            cache.remove_sequence(seq)
