"""A scattered page table: every page a sequence gets afterwards stands apart."""

from __future__ import annotations

from kvckpt_web.kv.cache import PagedKVCache
from kvckpt_web.kv.scatter import scatter_free_pages

from support.kvmodel import small_layout, small_limits


def test_scatter_free_pages_leaves_every_other_page_free_for_the_next_sequence(device):
    cache = PagedKVCache(device, small_layout(), small_limits(), transfer="copy")  # 17 pages of 4 tokens
    scatter_free_pages(cache, first_id=10)
    assert cache.get_num_available_pages() == 8
    cache.add_sequence(0)
    cache.begin_forward([0], [8 * 4])
    cache.end_forward()
    assert cache.seqs.get(0).pages == [1, 3, 5, 7, 9, 11, 13, 15]
    cache.close()
