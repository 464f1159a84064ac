"""What a user imports from ``kvckpt_web`` itself, whatever module defines it."""

from __future__ import annotations

import importlib

import pytest

import kvckpt_web
from kvckpt_web import errors

PUBLIC = ["PagedKVCache", "KVLayout", "CacheLimits", "open_device", "open_device_async", "Device", "DeviceArray",
          "HostTensor", "PageGroups", "save", "restore", "verify", "gc", "list_names", "list_generations",
          "MemoryStore", "FileStore", "ObjectStore", "HTTPStore", "IndexedDBStore", "OPFSStore", "read_tvm_export",
          "write_tvm_export", "Engine", "EngineConfig", "ChatRequest", "CompletionRequest", "ChatCompletion", "ChatChunk", "Ledger"]
ERRORS = sorted(name for name, value in vars(errors).items()
                if isinstance(value, type) and issubclass(value, errors.KVCkptError))


@pytest.mark.parametrize("name", PUBLIC + ERRORS)
def test_name_imports_from_the_package(name):
    value = getattr(importlib.import_module("kvckpt_web"), name)
    assert name in kvckpt_web.__all__
    assert value.__module__.startswith("kvckpt_web.")


def test_all_names_only_what_the_package_defines():
    assert sorted(kvckpt_web.__all__) == sorted(set(PUBLIC + ERRORS))
