"""The parts of a llama-style model that run on a PagedKVCache."""
