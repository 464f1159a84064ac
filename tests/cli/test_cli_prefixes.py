"""The store commands on a store that holds a prefix index (prefixes/ beside manifests/ and chunks/)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from kvckpt_web.cli.main import main
from kvckpt_web.durable.prefix_records import PrefixKey, encode_record, prefix_record
from kvckpt_web.durable.save import save
from kvckpt_web.durable.tvm_export import read_tvm_export
from kvckpt_web.stores.file import FileStore

SCOPE = "model-a|layout|kernels"


@pytest.fixture
def store_dir(tmp_path, make_model) -> Path:
    """A store holding 'a' (23 tokens of sequence 2) with its prefix record, and a record of a generation of
    'a' no longer stored."""
    model = make_model()
    model.add(2, 23)
    store = FileStore(tmp_path / "store")
    asyncio.run(save(model.cache, 2, store, "a", prefix=PrefixKey(SCOPE, tuple(range(23)))))
    orphan = prefix_record(PrefixKey(SCOPE, tuple(range(23))), "a", 9, 23, model.layout.page_size)
    asyncio.run(store.set(orphan.key, encode_record(orphan)))
    return tmp_path / "store"


def records(store: Path) -> list[str]:
    return sorted(str(p.relative_to(store)) for p in (store / "prefixes").rglob("*") if p.is_file())


def test_inspect_reads_such_a_store_and_counts_its_records(store_dir, capsys):
    assert main(["inspect", str(store_dir)]) == 0
    assert "prefix index: 2 records in 1 scopes, 1 of them of checkpoints no longer stored" in capsys.readouterr().out
    assert main(["inspect", str(store_dir), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["prefix_records"] == {
        "records": 2, "scopes": 1, "without_checkpoint": 1, "other_keys": 0}


def test_verify_passes_such_a_store_and_warns_about_a_record_without_its_checkpoint(store_dir, capsys):
    assert main(["verify", str(store_dir)]) == 0
    out = capsys.readouterr().out
    assert f"/a/{9:020d}: prefix index record of a checkpoint no longer stored" in out
    assert out.rstrip().endswith("intact")


def test_gc_deletes_the_record_without_its_checkpoint_and_keeps_the_other(store_dir, capsys):
    before = records(store_dir)
    assert main(["gc", str(store_dir)]) == 0
    assert "deleted 1 prefix index records" in capsys.readouterr().out
    assert records(store_dir) == [k for k in before if not k.endswith(f"{9:020d}")]


def test_convert_reads_such_a_store_and_adds_to_it(store_dir, tmp_path):
    assert main(["convert", str(store_dir), str(tmp_path / "tvm"), "--to", "tvm"]) == 0
    assert main(["convert", str(tmp_path / "tvm"), str(store_dir), "--to", "kvckpt", "--name", "b"]) == 0
    assert read_tvm_export(tmp_path / "tvm").metadata["seq_length"] == 23
