"""The paged KV cache on a device: page pool and sequences, page transfers and kernels, and the
checkpoint primitives TVM defines."""
