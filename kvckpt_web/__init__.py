"""kvckpt_web: a crash-resumable, TVM-compatible paged KV cache on WebGPU."""

from .cache import PagedKVCache
from .device import Device, open_device, open_device_async
from .errors import (CapacityError, CheckpointStateError, CorruptionError, DeviceError, FieldError, FormatError,
                     KVCkptError, LayoutHashMismatch, MetadataError, NotFoundError, SequenceError, StoreError,
                     TensorError, UnsupportedLayoutError)
from .layout import CacheLimits, KVLayout
from .tensors import DeviceArray, HostTensor, PageGroups

__all__ = [
    "CacheLimits", "CapacityError", "CheckpointStateError", "CorruptionError", "Device", "DeviceArray",
    "DeviceError", "FieldError", "FormatError", "HostTensor", "KVCkptError", "KVLayout", "LayoutHashMismatch",
    "MetadataError", "NotFoundError", "PageGroups", "PagedKVCache", "SequenceError", "StoreError", "TensorError",
    "UnsupportedLayoutError", "open_device", "open_device_async",
]
__version__ = "0.1.0"
