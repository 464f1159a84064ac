"""The text side of running a small LLM: GGUF files, its tokenizer, chat template and sampler."""
