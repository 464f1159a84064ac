"""WebGPU: the device interface and its commands, the backends, backend choice, the WGSL loader and
device tensors. Knows nothing of KV caches or models."""
