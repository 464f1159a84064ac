"""The kvckpt command line: inspect, convert --to tvm, demo, bench; one-line errors with exit status 1."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import numpy as np
import pytest

from kvckpt_web.cli import main
from kvckpt_web.tvm_export import METADATA_FILE, group_file, read_tvm_export, write_tvm_export


@pytest.fixture
def export_dir(tmp_path, make_model):
    """A TVM export directory of a 2-layer cache holding 11 tokens of random K/V."""
    model = make_model()
    model.add(0, 11)
    metadata = model.cache.get_checkpoint_metadata(0)
    groups = asyncio.run(model.cache.export_groups(0))
    return write_tvm_export(tmp_path / "src", metadata, groups)


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err
    assert err.startswith("kvckpt: error: ") and err.count("\n") == 1, err
    return err


def test_inspect_summarises_a_valid_export(export_dir, capsys):
    assert main(["inspect", str(export_dir)]) == 0
    out = capsys.readouterr().out
    assert "valid" in out and "sequence 0: 11 tokens in 3 logical pages" in out


def test_inspect_json_reports_layout_hash_length_and_sizes(export_dir, capsys):
    assert main(["inspect", str(export_dir), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    export = read_tvm_export(export_dir)
    assert info["layout_hash"] == export.metadata["layout_hash"]
    assert info["seq_length"] == 11 and info["num_groups"] == 2
    assert info["total_nbytes"] == sum(len(g) for g in export.groups)


def test_inspect_of_a_truncated_group_fails_with_one_line_naming_the_file(export_dir, capsys):
    path = export_dir / group_file(0)
    path.write_bytes(path.read_bytes()[:-4])
    assert main(["inspect", str(export_dir)]) == 1
    assert "group_0.bin" in _one_line_error(capsys)


def test_convert_to_tvm_reproduces_the_export_byte_for_byte(export_dir, tmp_path, capsys):
    assert main(["convert", str(export_dir), str(tmp_path / "dst"), "--to", "tvm"]) == 0
    src, dst = read_tvm_export(export_dir), read_tvm_export(tmp_path / "dst")
    assert dst.metadata_json == src.metadata_json
    assert dst.groups == src.groups


def test_convert_rejects_a_layout_hash_mismatch_and_writes_nothing(export_dir, tmp_path, capsys):
    meta = json.loads((export_dir / METADATA_FILE).read_text())
    meta["layout_hash"] = "0123456789abcdef"
    (export_dir / METADATA_FILE).write_text(json.dumps(meta))
    assert main(["convert", str(export_dir), str(tmp_path / "dst"), "--to", "tvm"]) == 1
    assert "layout_hash" in _one_line_error(capsys)
    assert not (tmp_path / "dst").exists()


def test_convert_rejects_what_tvm_rejects_a_wrong_seq_length(export_dir, tmp_path, capsys):
    meta = json.loads((export_dir / METADATA_FILE).read_text())
    meta["seq_length"] = 20
    (export_dir / METADATA_FILE).write_text(json.dumps(meta))
    assert main(["convert", str(export_dir), str(tmp_path / "dst"), "--to", "tvm"]) == 1
    assert "logical_pages" in _one_line_error(capsys)


def test_convert_refuses_an_existing_destination_without_force(export_dir, tmp_path, capsys):
    (tmp_path / "dst").mkdir()
    assert main(["convert", str(export_dir), str(tmp_path / "dst"), "--to", "tvm"]) == 1
    assert "--force" in _one_line_error(capsys)
    assert main(["convert", str(export_dir), str(tmp_path / "dst"), "--to", "tvm", "--force"]) == 0


def test_convert_of_a_tvm_export_reproduces_it_byte_for_byte(tmp_path, device, capsys):
    tvm_reference = pytest.importorskip("tvm_reference")
    if not tvm_reference.tvm_available():
        pytest.skip("apache-tvm is not installed")
    tvm_cache = tvm_reference.TVMCache(page_size=16, num_layers=2, num_qo_heads=4, num_kv_heads=2, head_dim=32,
                                       dtype="float16", rope_mode=tvm_reference.ROPE_NONE, max_total_seq_len=256)
    rng = np.random.default_rng(3)
    tvm_cache.add_sequence(0)
    shape = (2, 37, 2, 32)
    tvm_cache.append_seq(0, rng.standard_normal(shape).astype("float16"), rng.standard_normal(shape).astype("float16"))
    write_tvm_export(tmp_path / "tvm", tvm_cache.get_checkpoint_metadata(0), tvm_cache.export_groups(0))
    assert main(["convert", str(tmp_path / "tvm"), str(tmp_path / "ours"), "--to", "tvm"]) == 0
    theirs, ours = read_tvm_export(tmp_path / "tvm"), read_tvm_export(tmp_path / "ours")
    assert ours.metadata_json == theirs.metadata_json
    assert ours.groups == theirs.groups


def test_kv_only_demo_restores_every_byte_after_the_worker_is_killed(device, tmp_path):
    result = subprocess.run([sys.executable, "-m", "kvckpt_web.cli", "demo", "--kv-only", "--tokens", "70", "--dir",
                             str(tmp_path / "demo")], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "killed with SIGKILL" in result.stdout
    assert "identical" in result.stdout
    assert read_tvm_export(tmp_path / "demo").metadata["seq_length"] == 70


@pytest.mark.parametrize(("argv", "paths"), [([], ("all",)), (["--path", "mapped"], ("mapped",)),
                                             (["--path", "copy"], ("copy",))])
def test_bench_measures_every_transfer_the_device_offers_unless_told_one(monkeypatch, argv, paths):
    calls = []
    monkeypatch.setattr("kvckpt_web.bench.run", lambda names, repeats, p, **kw: calls.append((names, p)))
    main(["bench", "export", *argv])
    assert calls == [(["export"], paths)]
