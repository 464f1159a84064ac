"""The kvckpt command line: inspect, convert --to tvm, demo, bench; one-line errors with exit status 1."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys

import numpy as np
import pytest

from kvckpt_web.cli.main import main
from kvckpt_web.durable.tvm_export import METADATA_FILE, group_file, read_tvm_export, write_tvm_export


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
    tvm_reference = pytest.importorskip("support.tvm_reference")
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
    result = subprocess.run([sys.executable, "-m", "kvckpt_web.cli.main", "demo", "--kv-only", "--tokens", "70", "--dir",
                             str(tmp_path / "demo")], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "killed with SIGKILL" in result.stdout
    assert "identical" in result.stdout
    assert read_tvm_export(tmp_path / "demo").metadata["seq_length"] == 70


@pytest.mark.parametrize(("argv", "paths"), [([], ("all",)), (["--path", "mapped"], ("mapped",)),
                                             (["--path", "copy"], ("copy",))])
def test_bench_measures_every_transfer_the_device_offers_unless_told_one(monkeypatch, argv, paths):
    calls = []
    monkeypatch.setattr("kvckpt_web.bench.suite.run", lambda names, repeats, p, **kw: calls.append((names, p)))
    main(["bench", "export", *argv])
    assert calls == [(["export"], paths)]


@pytest.mark.parametrize(("argv", "model"), [([], None), (["--gemma"], "gemma")])
def test_bench_serve_takes_quick_the_gemma_model_and_the_peers_python(monkeypatch, tmp_path, argv, model):
    monkeypatch.setenv("KVCKPT_GEMMA_GGUF", str(tmp_path / "gemma.gguf"))
    calls = []
    monkeypatch.setattr("kvckpt_web.bench.suite.run",
                        lambda names, repeats, p, **kw: calls.append((names, kw["serve"])))
    main(["bench", "serve", "--quick", "--peer-python", "/venv/bin/python", *argv])
    expected = {"model": tmp_path / "gemma.gguf" if model else None, "peer_python": "/venv/bin/python", "quick": True}
    assert calls == [(["serve"], expected)]


def _fail_with(monkeypatch, name: str, errno_: int, under) -> None:
    """Make ``os.<name>`` (and ``open`` for ``"open"``) raise ``errno_`` for every path under ``under``."""
    import builtins
    import os

    def wrap(real):
        def fake(path, *args, **kwargs):
            if isinstance(path, (str, os.PathLike)) and str(path).startswith(str(under)):
                raise OSError(errno_, os.strerror(errno_), str(path))
            return real(path, *args, **kwargs)
        return fake

    if name == "open":
        monkeypatch.setattr(builtins, "open", wrap(builtins.open))
    monkeypatch.setattr(os, "open" if name == "open" else name, wrap(getattr(os, "open" if name == "open" else name)))


@pytest.mark.parametrize(("syscall", "code"), [("mkdir", 30), ("mkdir", 13), ("open", 28)])  # EROFS, EACCES, ENOSPC
def test_a_refused_write_of_a_tvm_export_is_one_line_naming_the_path(export_dir, tmp_path, capsys, monkeypatch,
                                                                     syscall, code):
    import os

    _fail_with(monkeypatch, syscall, code, tmp_path / "out")
    assert main(["convert", str(export_dir), str(tmp_path / "out" / "dst"), "--to", "tvm"]) == 1
    err = _one_line_error(capsys)
    assert os.strerror(code) in err and str(tmp_path / "out") in err


def test_a_group_file_that_cannot_be_read_is_one_line_naming_it(export_dir, capsys, monkeypatch):
    import os

    _fail_with(monkeypatch, "open", 13, export_dir / group_file(1))
    assert main(["inspect", str(export_dir)]) == 1
    err = _one_line_error(capsys)
    assert os.strerror(13) in err and group_file(1) in err


@pytest.mark.parametrize("dst", ["file", "/dev/null", "link"])
def test_convert_with_force_refuses_a_dst_that_is_no_directory_in_one_line(export_dir, tmp_path, capsys, dst):
    if dst == "file":
        (tmp_path / "file").write_text("mine")
    if dst == "link":
        (tmp_path / "link").symlink_to(export_dir)
    path = dst if dst.startswith("/") else str(tmp_path / dst)
    assert main(["convert", str(export_dir), path, "--to", "tvm", "--force"]) == 1
    _one_line_error(capsys)
    assert dst != "file" or (tmp_path / "file").read_text() == "mine"


def _demo(capfd, *argv: str) -> tuple[int, str]:
    """Run ``kvckpt demo --kv-only`` in this process (its workers write to the same stderr); exit status and
    stderr."""
    status = main(["demo", "--kv-only", *argv])
    return status, capfd.readouterr().err


def test_demo_refuses_a_directory_holding_other_files(tmp_path, capfd):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "photo.jpg").write_bytes(b"\xff\xd8")
    status, err = _demo(capfd, "--tokens", "20", "--dir", str(tmp_path / "d"))
    assert status == 1 and err.count("\n") == 1 and "photo.jpg" in err
    assert (tmp_path / "d" / "photo.jpg").read_bytes() == b"\xff\xd8"


def test_demo_refuses_a_tvm_export_of_another_layout(export_dir, capfd):
    before = read_tvm_export(export_dir)
    status, err = _demo(capfd, "--tokens", "20", "--dir", str(export_dir))
    assert status == 1 and "another cache layout" in err
    assert read_tvm_export(export_dir) == before


def test_demo_refuses_a_file_in_one_line(tmp_path, capfd):
    (tmp_path / "f").write_text("mine")
    status, err = _demo(capfd, "--tokens", "20", "--dir", str(tmp_path / "f"))
    assert status == 1 and err.startswith("kvckpt: error: ") and err.count("\n") == 1, err
    assert (tmp_path / "f").read_text() == "mine"


def test_demo_that_cannot_write_its_export_fails_in_one_line(device, capfd):
    status, err = _demo(capfd, "--tokens", "20", "--dir", "/proc/kvckpt-demo")
    assert status == 1 and err.startswith("kvckpt: error: demo worker failed") and err.count("\n") == 1, err


def test_demo_replaces_the_export_of_an_earlier_demo(device, tmp_path, capfd):
    assert _demo(capfd, "--tokens", "20", "--dir", str(tmp_path / "demo"))[0] == 0
    assert _demo(capfd, "--tokens", "40", "--dir", str(tmp_path / "demo"))[0] == 0
    assert read_tvm_export(tmp_path / "demo").metadata["seq_length"] == 40


@pytest.mark.parametrize("tokens", ["0", "-5"])
def test_demo_refuses_a_token_count_below_1_in_one_line(capfd, monkeypatch, tokens):
    monkeypatch.setattr("subprocess.Popen", lambda *a, **k: pytest.fail("started a worker for a bad --tokens"))
    status, err = _demo(capfd, "--tokens", tokens)
    assert status == 1 and err == f"kvckpt: error: --tokens: expected an integer >= 1, got {tokens}\n"


@pytest.mark.parametrize("argv, error", [
    (["--seed", "-1"], "--seed: expected an integer in [0, 18446744073709551615], got -1"),
    (["--kv-only", "--seed", "-1"], "--seed: expected an integer in [0, 18446744073709551615], got -1"),
    (["--seed", str(2**64)], "--seed: expected an integer in [0, 18446744073709551615]"),
    (["--dir", ""], "--dir: expected a path, got ''"),
    (["--kv-only", "--dir", ""], "--dir: expected a path, got ''"),
    (["--dir", "{tmp}/file"], "{tmp}/file: expected a store directory"),
    (["--dir", "{tmp}/mine"], "got 'a directory holding photo.jpg'"),
], ids=["negative-seed", "kv-only-negative-seed", "seed-over-64-bits", "empty-dir", "kv-only-empty-dir",
        "dir-that-is-a-file", "dir-of-other-files"])
def test_demo_refuses_bad_input_in_one_line_before_a_worker_starts(tmp_path, capsys, monkeypatch, argv, error):
    for demo in ("run_demo", "run_generation_demo"):
        monkeypatch.setattr(f"kvckpt_web.cli.main.{demo}", lambda *a, **k: pytest.fail("started the demo"))
    (tmp_path / "file").write_text("mine")
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "photo.jpg").write_text("mine")
    assert main(["demo", *(a.replace("{tmp}", str(tmp_path)) for a in argv)]) == 1
    assert error.replace("{tmp}", str(tmp_path)) in _one_line_error(capsys)
    assert (tmp_path / "file").read_text() == (tmp_path / "mine" / "photo.jpg").read_text() == "mine"


def _ctrl_c_as_in_a_terminal() -> None:
    """Ctrl-C's signal handled as a terminal's user gets it, even where this suite runs in a background job
    (which starts with it ignored, and a Python started so keeps ignoring it)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_is_one_line_and_exit_status_130(device, tmp_path):
    worker = subprocess.Popen([sys.executable, "-m", "kvckpt_web.cli", "_demo-worker", str(tmp_path / "export"), "20",
                               "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              preexec_fn=_ctrl_c_as_in_a_terminal)
    try:
        assert json.loads(worker.stdout.readline())["bytes"] > 0  # exported: it now waits to be killed
        worker.send_signal(signal.SIGINT)
        _, err = worker.communicate(timeout=120)
    finally:
        worker.kill()
    assert (worker.returncode, err) == (130, "kvckpt: interrupted\n")


@pytest.mark.parametrize("argv", [["soak", "--trials", "-3"], ["soak", "--trials", "0"], ["export", "--repeats", "0"]])
def test_bench_refuses_counts_below_1_before_running(monkeypatch, capsys, argv):
    monkeypatch.setattr("kvckpt_web.bench.suite.run", lambda *a, **k: pytest.fail("ran a benchmark with a bad count"))
    assert main(["bench", *argv]) == 1
    assert "expected an integer >= 1" in _one_line_error(capsys)


@pytest.fixture
def pyodide_dir(tmp_path):
    (tmp_path / "pyodide").mkdir()
    (tmp_path / "pyodide" / "pyodide.mjs").write_text("export {}")
    return tmp_path / "pyodide"


@pytest.mark.parametrize("where", [["--port", "70000"], ["--port", "-1"], ["--host", "256.0.0.1.invalid."],
                                   ["--host", "bad\x00host"]])
def test_serve_where_it_cannot_listen_is_one_line(pyodide_dir, capsys, where):
    assert main(["serve", "--pyodide", str(pyodide_dir), *where]) == 1
    _one_line_error(capsys)


def test_serve_on_a_port_in_use_is_one_line(pyodide_dir, capsys):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        assert main(["serve", "--pyodide", str(pyodide_dir), "--port", str(taken.getsockname()[1])]) == 1
    assert "in use" in _one_line_error(capsys)
