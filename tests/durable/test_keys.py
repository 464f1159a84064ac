"""The key layout of a checkpoint store (FORMAT.md section 1): manifest and chunk keys, names, generations."""

from __future__ import annotations

from typing import Any

import pytest

from kvckpt_web.durable.keys import MAX_INT, chunk_key, manifest_key, manifest_prefix, parse_manifest_key, validate_name
from kvckpt_web.errors import FieldError, FormatError
from kvckpt_web.stores.base import validate_key

D0 = "be45cb2605bf36bebde684841a28f0fd43c69850a3dce5fedba69928ee3a8991"


def test_keys_are_valid_store_keys() -> None:
    assert chunk_key(D0) == f"chunks/{D0}"
    assert manifest_key("seq-a", 2) == "manifests/seq-a/00000000000000000002"
    assert manifest_key("s", MAX_INT) == f"manifests/s/{MAX_INT:020d}"
    assert manifest_prefix("seq-a") == "manifests/seq-a/"
    for key in (chunk_key(D0), manifest_key("x" * 128, 10**15)):
        assert validate_key(key) == key


def test_manifest_keys_sort_by_generation() -> None:
    keys = [manifest_key("s", g) for g in (10, 9, 100, 1)]
    assert sorted(keys) == [manifest_key("s", g) for g in (1, 9, 10, 100)]


def test_parse_manifest_key() -> None:
    assert parse_manifest_key(manifest_key("seq-a", 42)) == ("seq-a", 42)
    for bad in ["manifests/s/1", "manifests/s/00000000000000000000", "chunks/s/00000000000000000001",
                "manifests/a b/00000000000000000001", "manifests/s/00000000000000000001/x", 5]:
        with pytest.raises(FormatError):
            parse_manifest_key(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["", ".", "..", "a/b", "x" * 129, "sp ace", "ü", None, 3])
def test_bad_names(name: Any) -> None:
    with pytest.raises(FieldError) as info:
        validate_name(name)
    assert info.value.field == "name"
    with pytest.raises(FieldError):
        manifest_key(name, 1)


@pytest.mark.parametrize("name", ["a", "x" * 128, "...", "seq_1.v-2"])
def test_good_names(name: str) -> None:
    assert validate_name(name) == name


@pytest.mark.parametrize("digest", ["", D0.upper(), D0[:-1], D0 + "0", None])
def test_bad_chunk_digest(digest: Any) -> None:
    with pytest.raises(FieldError, match="digest"):
        chunk_key(digest)


@pytest.mark.parametrize("generation", [0, -1, 1.5, True, MAX_INT + 1])
def test_bad_generation(generation: Any) -> None:
    with pytest.raises(FieldError, match="generation"):
        manifest_key("s", generation)
