"""kvckpt_web: a crash-resumable, TVM-compatible paged KV cache on WebGPU."""

from .durable.catalog import list_generations, list_names
from .durable.ledger import Ledger
from .durable.restore import restore
from .durable.retention import gc
from .durable.save import save
from .durable.tvm_export import read_tvm_export, write_tvm_export
from .durable.verify import verify
from .engine import ChatChunk, ChatCompletion, ChatRequest, CompletionRequest, Engine, EngineConfig
from .errors import (BadValueError, CapacityError, CheckpointStateError, ConflictError, ContextFullError,
                     CorruptionError, DataError, DeviceError, FieldError, FormatError, KVCkptError, LayoutHashMismatch,
                     MetadataError, ModelUnavailableError, NotFoundError, SequenceError, StoreError, TensorError,
                     UnsupportedLayoutError, UnusableCheckpointError)
from .gpu.device import Device
from .gpu.open import open_device, open_device_async
from .gpu.tensors import DeviceArray, HostTensor
from .kv.cache import PagedKVCache
from .kv.page_groups import PageGroups
from .stores.file import FileStore
from .stores.http import HTTPStore
from .stores.indexeddb import IndexedDBStore
from .stores.memory import MemoryStore
from .stores.objects import ObjectStore
from .stores.opfs import OPFSStore
from .tvm.layout import CacheLimits, KVLayout

__all__ = [
    "BadValueError", "CacheLimits", "CapacityError", "ChatChunk", "ChatCompletion", "ChatRequest",
    "CheckpointStateError", "CompletionRequest", "ConflictError", "ContextFullError", "CorruptionError", "DataError", "Device",
    "DeviceArray", "DeviceError", "Engine", "EngineConfig", "FieldError", "FileStore", "FormatError", "HTTPStore",
    "HostTensor", "IndexedDBStore", "KVCkptError", "KVLayout", "LayoutHashMismatch", "Ledger", "MemoryStore",
    "MetadataError", "ModelUnavailableError", "NotFoundError", "OPFSStore", "ObjectStore", "PageGroups",
    "PagedKVCache", "SequenceError", "StoreError", "TensorError", "UnsupportedLayoutError", "UnusableCheckpointError",
    "gc", "list_generations", "list_names", "open_device", "open_device_async", "read_tvm_export", "restore", "save",
    "verify", "write_tvm_export",
]
__version__ = "0.1.0"
