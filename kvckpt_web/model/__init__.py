"""A small llama-architecture language model on the paged WebGPU cache: its GGUF file, tokenizer, chat
template, sampler, WGSL kernels, runner and the caches of its layout."""
