"""Apache TVM's paged KV cache contract in pure Python: the layout, its limits and descriptor hash, and
the checkpoint metadata text TVM writes and validates."""
