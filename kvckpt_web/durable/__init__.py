"""Durable checkpoints: the chunked container format, save/restore/gc/verify on a store, the save
pipeline, and TVM's export directories."""
