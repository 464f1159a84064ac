"""The kvckpt commands on checkpoint stores: convert --to kvckpt|tvm, inspect, verify, gc; progress on stderr."""

from __future__ import annotations

import asyncio
import io
import json
import os
from pathlib import Path

import pytest

from kvckpt_web.cli.main import main
from kvckpt_web.cli.store_commands import progress_printer
from kvckpt_web.durable.container import MAX_MANIFEST_BYTES
from kvckpt_web.durable.save import save
from kvckpt_web.errors import StoreError
from kvckpt_web.durable.catalog import list_generations
from kvckpt_web.stores.file import FileStore
from kvckpt_web.durable.tvm_export import group_file, read_tvm_export, write_tvm_export


@pytest.fixture
def export_dir(tmp_path, make_model) -> Path:
    """A TVM export directory of sequence 2 of a 2-layer cache, 23 tokens of random K/V."""
    model = make_model()
    model.add(2, 23)
    return write_tvm_export(tmp_path / "src", model.cache.get_checkpoint_metadata(2),
                            asyncio.run(model.cache.export_groups(2)))


@pytest.fixture
def store_dir(export_dir, tmp_path) -> Path:
    """A store holding the export as 'a' (generation 1)."""
    assert main(["convert", str(export_dir), str(tmp_path / "store"), "--to", "kvckpt", "--name", "a"]) == 0
    return tmp_path / "store"


CONVERSATION = {"conversation": {"id": "c0" * 16, "created_ms": 1_700_000_000_000}}
"""The app_state of a checkpoint of one conversation."""


def save_generation(store: Path, model, name: str = "a", app_state: dict | None = None) -> None:
    """The next generation of ``name`` in ``store``: ``model``'s sequence 2, saved through the library (no
    retention, no check of the conversation the name holds)."""
    asyncio.run(save(model.cache, 2, FileStore(store), name, app_state=app_state or {}, keep=None))


@pytest.fixture
def conversation_store(tmp_path, make_model) -> Path:
    """A store holding generations 1, 2 and 3 of one conversation as 'chat', of 23, 24 and 25 tokens."""
    model = make_model()
    model.add(2, 22)
    for _ in range(3):
        model.append({2: 1})
        save_generation(tmp_path / "conversation", model, "chat", CONVERSATION)
    return tmp_path / "conversation"


def generations(store: Path) -> list[tuple[str, int]]:
    return [(i.name, i.generation) for i in asyncio.run(list_generations(FileStore(store, read_only=True)))]


def test_convert_to_kvckpt_and_back_to_tvm_is_byte_identical(export_dir, store_dir, tmp_path, capsys):
    assert main(["convert", str(store_dir), str(tmp_path / "back"), "--to", "tvm"]) == 0
    src, back = read_tvm_export(export_dir), read_tvm_export(tmp_path / "back")
    assert back.metadata_json == src.metadata_json
    assert back.groups == src.groups


def test_convert_to_kvckpt_names_the_sequence_seq0_by_default(export_dir, tmp_path, capsys):
    assert main(["convert", str(export_dir), str(tmp_path / "store"), "--to", "kvckpt"]) == 0
    assert generations(tmp_path / "store") == [("seq0", 1)]
    assert "as 'seq0' generation 1" in capsys.readouterr().out


def test_converting_a_conversation_again_adds_a_generation_and_stores_no_chunk_twice(conversation_store, tmp_path,
                                                                                       capsys):
    assert main(["convert", str(conversation_store), str(tmp_path / "copy"), "--to", "kvckpt"]) == 0
    capsys.readouterr()
    assert main(["convert", str(conversation_store), str(tmp_path / "copy"), "--to", "kvckpt"]) == 0
    assert "generation 2 (0 chunks written)" in capsys.readouterr().out
    assert generations(tmp_path / "copy") == [("chat", 1), ("chat", 2)]


def test_convert_from_a_store_reads_the_generation_asked_for(export_dir, store_dir, tmp_path, make_model):
    model = make_model(seed=9)
    model.add(2, 5)
    write_tvm_export(tmp_path / "other", model.cache.get_checkpoint_metadata(2),
                     asyncio.run(model.cache.export_groups(2)))
    save_generation(store_dir, model)
    assert main(["convert", str(store_dir), str(tmp_path / "g1"), "--to", "tvm", "--generation", "1"]) == 0
    assert main(["convert", str(store_dir), str(tmp_path / "g2"), "--to", "tvm"]) == 0
    assert read_tvm_export(tmp_path / "g1").groups == read_tvm_export(export_dir).groups
    assert read_tvm_export(tmp_path / "g2").groups == read_tvm_export(tmp_path / "other").groups


def test_convert_from_a_store_of_several_names_needs_a_name(export_dir, store_dir, tmp_path, capsys):
    assert main(["convert", str(export_dir), str(store_dir), "--to", "kvckpt", "--name", "b"]) == 0
    capsys.readouterr()
    assert main(["convert", str(store_dir), str(tmp_path / "out"), "--to", "tvm"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("kvckpt: error: ") and "--name" in err and "['a', 'b']" in err
    assert main(["convert", str(store_dir), str(tmp_path / "out"), "--to", "tvm", "--name", "b"]) == 0


def test_inspect_json_lists_names_generations_sizes_and_sharing(export_dir, store_dir, capsys):
    assert main(["convert", str(export_dir), str(store_dir), "--to", "kvckpt", "--name", "b"]) == 0
    capsys.readouterr()
    assert main(["inspect", str(store_dir), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["kind"] == "kvckpt-store" and sorted(info["names"]) == ["a", "b"]
    (a,) = info["names"]["a"]
    export = read_tvm_export(export_dir)
    assert (a["generation"], a["seq_id"], a["seq_length"]) == (1, 2, 23)
    assert a["nbytes"] == sum(len(g) for g in export.groups)
    assert a["shared_chunks"] == a["distinct_chunks"] == 2  # 'b' holds the same bytes
    assert info["chunks"]["referenced_nbytes"] == a["nbytes"] and info["chunks"]["logical_nbytes"] == 2 * a["nbytes"]


def test_inspect_summarises_a_store(store_dir, capsys):
    assert main(["inspect", str(store_dir)]) == 0
    out = capsys.readouterr().out
    assert "1 names, 1 manifests, 2 chunks" in out
    assert "generation 1" in out and "seq 2, 23 tokens" in out


def test_verify_exits_0_for_an_intact_store_after_loading_it(store_dir, capsys):
    assert main(["verify", str(store_dir)]) == 0
    out = capsys.readouterr().out
    assert "1 checkpoints loaded into a GPU cache" in out and out.rstrip().endswith("intact")


def test_verify_exits_1_naming_a_damaged_chunk(store_dir, capsys):
    chunk = sorted((store_dir / "chunks").iterdir())[0]
    data = bytearray(chunk.read_bytes())
    data[7] ^= 0x10
    chunk.write_bytes(bytes(data))
    assert main(["verify", str(store_dir)]) == 1
    out = capsys.readouterr().out
    assert f"chunks/{chunk.name}" in out and "DAMAGED" in out


def test_verify_exits_1_for_a_name_the_store_does_not_hold(store_dir, capsys):
    assert main(["verify", str(store_dir), "--name", "zzz", "--no-load"]) == 1
    assert "no checkpoint named 'zzz'" in capsys.readouterr().out


def test_gc_keeps_the_newest_generations_and_deletes_unused_chunks(store_dir, make_model, capsys):
    model = make_model(seed=4)
    model.add(2, 30)
    for _ in range(2):
        save_generation(store_dir, model)
    assert generations(store_dir) == [("a", 1), ("a", 2), ("a", 3)]
    capsys.readouterr()
    assert main(["gc", str(store_dir), "--keep", "1"]) == 0
    assert "deleted 2 manifests and 2 unreferenced chunks" in capsys.readouterr().out
    assert generations(store_dir) == [("a", 3)]
    assert main(["verify", str(store_dir), "--no-load"]) == 0


def test_gc_exits_1_and_deletes_no_chunk_while_a_manifest_is_damaged(store_dir, capsys):
    manifest = store_dir / "manifests" / "a" / f"{1:020d}"
    manifest.write_bytes(manifest.read_bytes()[:-1])
    chunks = sorted((store_dir / "chunks").iterdir())
    assert main(["gc", str(store_dir)]) == 1
    assert "damaged manifests" in capsys.readouterr().err
    assert sorted((store_dir / "chunks").iterdir()) == chunks


def test_gc_keep_1_keeps_the_older_generation_when_the_newest_manifest_is_truncated(export_dir, store_dir, tmp_path,
                                                                                     make_model, capsys):
    model = make_model(seed=4)
    model.add(2, 30)
    save_generation(store_dir, model)
    newest = store_dir / "manifests" / "a" / f"{2:020d}"
    newest.write_bytes(newest.read_bytes()[:-40])
    capsys.readouterr()
    assert main(["gc", str(store_dir), "--keep", "1"]) == 1  # a damaged manifest is kept: no chunk deleted
    out = capsys.readouterr().out
    assert generations(store_dir) == [("a", 1), ("a", 2)]
    assert f"kept manifests/a/{1:020d}: restorable, 1 of the newest 1" in out
    assert f"kept manifests/a/{2:020d}: damaged, kept as evidence and not counted" in out
    assert main(["convert", str(store_dir), str(tmp_path / "back"), "--to", "tvm", "--generation", "1"]) == 0
    assert read_tvm_export(tmp_path / "back").groups == read_tvm_export(export_dir).groups


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err
    assert err.startswith("kvckpt: error: ") and err.count("\n") == 1, err
    return err


def snapshot(path: Path) -> dict[str, bytes]:
    """Every file under ``path`` and its bytes, to show a command left them as they were."""
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def test_convert_to_tvm_refuses_a_checkpoint_of_sliding_window_layers_naming_why(tmp_path, make_model, capsys):
    model = make_model(attn_kinds=("mha_sliding", "mha"), support_layer_sliding_window=True, sliding_window=8)
    model.add(2, 23)
    save_generation(tmp_path / "store", model)
    assert main(["convert", str(tmp_path / "store"), str(tmp_path / "out"), "--to", "tvm"]) == 1
    assert "TVM's checkpoints (format_version 1) do not support sliding-window" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_convert_to_tvm_with_force_refuses_to_replace_a_store(store_dir, capsys):
    before = snapshot(store_dir)
    assert main(["convert", str(store_dir), str(store_dir), "--to", "tvm", "--force", "--name", "a"]) == 1
    one_line_error(capsys)
    assert snapshot(store_dir) == before


def test_convert_to_tvm_with_force_refuses_another_store_as_dst(export_dir, store_dir, capsys):
    before = snapshot(store_dir)
    assert main(["convert", str(export_dir), str(store_dir), "--to", "tvm", "--force"]) == 1
    assert "a TVM export directory" in one_line_error(capsys)
    assert snapshot(store_dir) == before


def test_convert_to_tvm_with_force_refuses_a_directory_of_other_files(export_dir, tmp_path, capsys):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "thesis.tex").write_text("years of work")
    assert main(["convert", str(export_dir), str(tmp_path / "docs"), "--to", "tvm", "--force"]) == 1
    assert "thesis.tex" in one_line_error(capsys)
    assert (tmp_path / "docs" / "thesis.tex").read_text() == "years of work"


def test_convert_to_tvm_with_force_refuses_its_own_source(export_dir, capsys):
    before = snapshot(export_dir)
    assert main(["convert", str(export_dir), str(export_dir), "--to", "tvm", "--force"]) == 1
    assert "SRC" in one_line_error(capsys)
    assert snapshot(export_dir) == before


def test_convert_refuses_a_dst_inside_its_source_store(store_dir, capsys):
    assert main(["convert", str(store_dir), str(store_dir / "out"), "--to", "tvm"]) == 1
    assert "SRC" in one_line_error(capsys)
    assert not (store_dir / "out").exists()


def test_the_converts_of_the_issue_leave_the_first_generation_of_chat_intact(export_dir, tmp_path, capsys):
    """``kvckpt convert t S --to kvckpt --name chat --keep 10`` three times, then ``kvckpt convert S S --to kvckpt
    --generation 1``, dropped generations 1 and 2: a TVM export is a new conversation each time, so the repeats are
    refused on a name that holds one, and so is S into itself; nothing of S is dropped."""
    store = tmp_path / "S"
    codes = [main(["convert", str(export_dir), str(store), "--to", "kvckpt", "--name", "chat", "--keep", "10"])
             for _ in range(3)]
    before = snapshot(store)
    codes.append(main(["convert", str(store), str(store), "--to", "kvckpt", "--generation", "1"]))
    assert codes == [0, 1, 1, 1]
    assert snapshot(store) == before and generations(store) == [("chat", 1)]


@pytest.mark.parametrize("via", ["its path", "a symbolic link"])
def test_convert_of_a_store_into_itself_is_refused_before_the_gpu_is_touched(conversation_store, tmp_path, capsys,
                                                                            monkeypatch, via):
    dst = conversation_store
    if via == "a symbolic link":
        dst = tmp_path / "link"
        dst.symlink_to(conversation_store)
    monkeypatch.setattr("kvckpt_web.cli.store_commands.open_device", lambda: pytest.fail("opened the GPU"))
    before = snapshot(conversation_store)
    assert main(["convert", str(conversation_store), str(dst), "--to", "kvckpt", "--generation", "1"]) == 1
    assert "SRC" in one_line_error(capsys)
    assert snapshot(conversation_store) == before


def test_convert_into_a_store_holding_the_conversation_adds_a_generation_and_keeps_every_older_one(
        conversation_store, tmp_path):
    for generation in ("1", "2", "3", "1"):
        assert main(["convert", str(conversation_store), str(tmp_path / "B"), "--to", "kvckpt",
                     "--generation", generation]) == 0
    infos = asyncio.run(list_generations(FileStore(tmp_path / "B", read_only=True)))
    assert [(i.generation, i.seq_length) for i in infos] == [(1, 23), (2, 24), (3, 25), (4, 23)]


def test_convert_with_keep_drops_the_older_generations_of_the_name(conversation_store, tmp_path):
    for generation in ("1", "2", "3"):
        assert main(["convert", str(conversation_store), str(tmp_path / "B"), "--to", "kvckpt",
                     "--generation", generation, "--keep", "2"]) == 0
    assert generations(tmp_path / "B") == [("chat", 2), ("chat", 3)]


def test_convert_into_a_name_holding_another_conversation_is_refused_before_the_gpu_is_touched(
        export_dir, store_dir, capsys, monkeypatch):
    before = snapshot(store_dir)
    with monkeypatch.context() as patched:
        patched.setattr("kvckpt_web.cli.store_commands.open_device", lambda: pytest.fail("opened the GPU"))
        assert main(["convert", str(export_dir), str(store_dir), "--to", "kvckpt", "--name", "a"]) == 1
    error = one_line_error(capsys)
    assert "--name" in error and "'a'" in error and "another conversation" in error
    assert snapshot(store_dir) == before
    assert main(["convert", str(export_dir), str(store_dir), "--to", "kvckpt", "--name", "b"]) == 0
    assert generations(store_dir) == [("a", 1), ("b", 1)]


def test_convert_into_a_name_another_writer_holds_is_refused(conversation_store, tmp_path, capsys):
    assert main(["convert", str(conversation_store), str(tmp_path / "B"), "--to", "kvckpt"]) == 0
    capsys.readouterr()
    before = snapshot(tmp_path / "B")
    held = FileStore(tmp_path / "B").claim("chat")  # as a generation writing 'chat' holds it
    asyncio.run(held.__aenter__())
    try:
        assert main(["convert", str(conversation_store), str(tmp_path / "B"), "--to", "kvckpt"]) == 1
    finally:
        asyncio.run(held.__aexit__(None, None, None))
    assert "held by another writer" in one_line_error(capsys)
    assert snapshot(tmp_path / "B") == before


def test_convert_to_tvm_with_force_replaces_a_tvm_export(export_dir, store_dir, tmp_path, capsys):
    assert main(["convert", str(store_dir), str(tmp_path / "out"), "--to", "tvm"]) == 0
    (tmp_path / "out" / group_file(0)).write_bytes(b"stale")
    assert main(["convert", str(store_dir), str(tmp_path / "out"), "--to", "tvm", "--force"]) == 0
    assert read_tvm_export(tmp_path / "out").groups == read_tvm_export(export_dir).groups


@pytest.mark.parametrize(("command", "what"), [
    (command, what) for command in (["inspect"], ["verify", "--no-load"], ["gc"])
    for what in ("empty", "tvm-export", "other files") if (command, what) != (["inspect"], "tvm-export")])
def test_store_commands_refuse_a_directory_that_is_not_a_store_and_leave_it_as_it_was(export_dir, tmp_path, capsys,
                                                                                      command, what):
    path = {"empty": tmp_path / "empty", "tvm-export": export_dir, "other files": tmp_path / "etc"}[what]
    path.mkdir(exist_ok=True)
    if what == "other files":
        (path / "passwd").write_text("root:x:0:0")
    before = snapshot(path)
    assert main([command[0], str(path), *command[1:]]) == 1
    assert str(path) in one_line_error(capsys)
    assert snapshot(path) == before and sorted(p.name for p in path.iterdir()) == sorted(before)


def test_gc_of_a_tvm_export_leaves_it_readable(export_dir, capsys):
    main(["gc", str(export_dir)])
    capsys.readouterr()
    assert main(["inspect", str(export_dir)]) == 0


def test_convert_to_kvckpt_refuses_a_dst_holding_other_files(export_dir, tmp_path, capsys):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "notes").write_text("mine")
    assert main(["convert", str(export_dir), str(tmp_path / "docs"), "--to", "kvckpt"]) == 1
    assert "notes" in one_line_error(capsys)
    assert sorted(p.name for p in (tmp_path / "docs").iterdir()) == ["notes"]


def test_inspect_exits_1_for_a_store_with_a_damaged_manifest(store_dir, capsys):
    manifest = store_dir / "manifests" / "a" / f"{1:020d}"
    manifest.write_bytes(manifest.read_bytes()[:-1])
    assert main(["inspect", str(store_dir)]) == 1
    assert "DAMAGED" in capsys.readouterr().out


@pytest.mark.parametrize("argv", [["--name", "a/b"], ["--keep", "0"], ["--name", ""], ["--generation", "1"]])
def test_a_convert_with_a_bad_argument_fails_before_loading_and_leaves_no_dst(export_dir, tmp_path, capsys,
                                                                              monkeypatch, argv):
    monkeypatch.setattr("kvckpt_web.cli.store_commands.open_device", lambda: pytest.fail("opened the GPU for bad arguments"))
    assert main(["convert", str(export_dir), str(tmp_path / "new"), "--to", "kvckpt", *argv]) == 1
    one_line_error(capsys)
    assert not (tmp_path / "new").exists()


def test_a_convert_to_kvckpt_that_fails_leaves_no_dst_it_created(export_dir, tmp_path, capsys, monkeypatch):
    async def fail(*args, **kwargs):
        raise StoreError("disk gone")

    monkeypatch.setattr("kvckpt_web.cli.store_commands.save", fail)
    assert main(["convert", str(export_dir), str(tmp_path / "new"), "--to", "kvckpt"]) == 1
    assert "disk gone" in one_line_error(capsys)
    assert not (tmp_path / "new").exists()


def test_gc_of_a_name_the_store_does_not_hold_is_an_error(store_dir, capsys):
    before = snapshot(store_dir)
    assert main(["gc", str(store_dir), "--name", "nope"]) == 1
    assert "'nope'" in one_line_error(capsys)
    assert snapshot(store_dir) == before


def test_gc_with_a_negative_keep_is_an_error(store_dir, capsys):
    assert main(["gc", str(store_dir), "--keep", "-1"]) == 1
    assert "--keep" in one_line_error(capsys)


def test_inspect_refuses_a_manifest_that_is_a_fifo_without_blocking(store_dir, capsys, unblock_fifo):
    manifest = store_dir / "manifests" / "a" / f"{1:020d}"
    manifest.unlink()
    unblock_fifo(manifest)
    assert main(["inspect", str(store_dir)]) == 1
    assert "FIFO" in one_line_error(capsys)


def test_inspect_refuses_a_manifest_longer_than_the_format_allows_before_reading_it(store_dir, capsys):
    manifest = store_dir / "manifests" / "a" / f"{1:020d}"
    os.truncate(manifest, MAX_MANIFEST_BYTES + 1)
    assert main(["inspect", str(store_dir)]) == 1
    assert f"at most {MAX_MANIFEST_BYTES} bytes" in one_line_error(capsys)


@pytest.mark.parametrize("command", [["verify", "--no-load"], ["verify"]])
def test_verify_reports_a_chunk_that_is_a_fifo_as_damage_without_blocking(store_dir, capsys, unblock_fifo, command):
    chunk = sorted((store_dir / "chunks").iterdir())[0]
    chunk.unlink()
    unblock_fifo(chunk)
    assert main([command[0], str(store_dir), *command[1:]]) == 1
    out, err = capsys.readouterr()
    problems = [line for line in out.splitlines() if line.startswith("PROBLEM: ")]
    assert len(problems) == 1 and f"chunks/{chunk.name}" in problems[0] and "FIFO" in problems[0], out
    assert f"{len(list((store_dir / 'chunks').iterdir()))} chunks" in out and "error" not in err


def test_verify_reports_a_manifest_that_is_a_symbolic_link_as_damaged_not_followed(store_dir, capsys):
    manifest = store_dir / "manifests" / "a" / f"{1:020d}"
    manifest.unlink()
    manifest.symlink_to("/dev/zero")
    assert main(["verify", str(store_dir), "--no-load"]) == 1
    assert "symbolic link" in capsys.readouterr().out


def test_progress_lines_go_to_the_stream_for_long_operations():
    stream = io.StringIO()
    show = progress_printer(stream, delay=0.0, every=0.0)
    for done in range(1, 4):
        show("save", done, 3)
    assert stream.getvalue() == "save: 1/3\nsave: 2/3\nsave: 3/3\n"


def test_progress_stays_quiet_for_short_operations():
    stream = io.StringIO()
    show = progress_printer(stream)
    show("save", 1, 1)
    assert stream.getvalue() == ""


def test_convert_from_a_directory_that_is_no_checkpoint_names_both_kinds(tmp_path, capsys):
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "passwd").write_text("root:x:0:0")
    assert main(["convert", str(tmp_path / "etc"), str(tmp_path / "out"), "--to", "tvm"]) == 1
    err = one_line_error(capsys)
    assert "a TVM export directory" in err and "a store directory" in err and "passwd" in err


def test_a_convert_to_kvckpt_that_fails_removes_only_what_it_wrote(export_dir, tmp_path, capsys, monkeypatch,
                                                                    make_model):
    from kvckpt_web.cli import store_commands
    from kvckpt_web.durable.catalog import load_manifest

    theirs = make_model()
    theirs.add(2, 30)
    real_save = store_commands.save

    async def commit_then_fail(cache, seq_id, store, name, **kwargs):
        await real_save(theirs.cache, 2, FileStore(tmp_path / "new"), "theirs", keep=None)  # another process's
        await real_save(cache, seq_id, store, name, **kwargs)
        raise StoreError("disk gone")

    monkeypatch.setattr(store_commands, "save", commit_then_fail)
    assert main(["convert", str(export_dir), str(tmp_path / "new"), "--to", "kvckpt"]) == 1
    assert "disk gone" in one_line_error(capsys)
    assert generations(tmp_path / "new") == [("theirs", 1)]
    kept = FileStore(tmp_path / "new", read_only=True)
    assert set(asyncio.run(kept.list_prefix("chunks/"))) == set(asyncio.run(load_manifest(kept, "theirs"))[0].chunk_keys())
    assert main(["verify", str(tmp_path / "new"), "--no-load"]) == 0


def test_sync_to_a_url_of_an_unknown_scheme_is_refused_naming_it_and_writes_nothing(store_dir, tmp_path, capsys,
                                                                                     monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["sync", str(store_dir), "ftp://x/y"]) == 1
    error = one_line_error(capsys)
    assert "DST: expected" in error and "no ftp:// store" in error
    assert not (tmp_path / "ftp:").exists()
