"""A small llama-architecture language model running on the paged WebGPU cache."""
