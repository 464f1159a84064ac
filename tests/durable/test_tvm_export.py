"""TVM export directories: metadata.json verbatim + group_<i>.bin, strict on read, atomic on write."""

from __future__ import annotations

import json
import os

import pytest

from kvckpt_web.errors import FieldError, FormatError, MetadataError, UnsupportedLayoutError
from kvckpt_web.tvm.layout import CacheLimits, KVLayout
from kvckpt_web.tvm.metadata import write_metadata
from kvckpt_web.durable import tvm_export
from kvckpt_web.durable.tvm_export import METADATA_FILE, MAX_METADATA_BYTES, group_file, read_tvm_export, write_tvm_export

LAYOUT = KVLayout(page_size=4, num_layers=2, num_qo_heads=4, num_kv_heads=2, qk_head_dim=8)


def _export(seq_length: int = 6) -> tuple[str, list[bytes]]:
    metadata = write_metadata(LAYOUT, CacheLimits(4, 64, 64), 0, seq_length)
    nbytes = LAYOUT.num_logical_pages(seq_length) * LAYOUT.page_bytes
    return metadata, [bytes([g + 1]) * nbytes for g in range(LAYOUT.num_layers)]


def test_write_then_read_returns_the_metadata_text_and_groups_verbatim(tmp_path):
    metadata, groups = _export()
    write_tvm_export(tmp_path / "ckpt", metadata, groups)
    export = read_tvm_export(tmp_path / "ckpt")
    assert export.metadata_json == metadata
    assert export.groups == groups
    assert (tmp_path / "ckpt" / METADATA_FILE).read_text() == metadata
    assert (tmp_path / "ckpt" / group_file(1)).read_bytes() == groups[1]


def test_write_leaves_no_temporary_directory_behind(tmp_path):
    write_tvm_export(tmp_path / "ckpt", *_export())
    assert sorted(os.listdir(tmp_path)) == ["ckpt"]


def test_write_refuses_an_existing_path_unless_overwrite(tmp_path):
    metadata, groups = _export()
    write_tvm_export(tmp_path / "ckpt", metadata, groups)
    with pytest.raises(FieldError, match="does not exist yet"):
        write_tvm_export(tmp_path / "ckpt", metadata, groups)
    other, other_groups = _export(seq_length=9)
    write_tvm_export(tmp_path / "ckpt", other, other_groups, overwrite=True)
    assert read_tvm_export(tmp_path / "ckpt").metadata_json == other


def test_write_rejects_a_group_whose_size_disagrees_with_the_metadata(tmp_path):
    metadata, groups = _export()
    with pytest.raises(FieldError) as err:
        write_tvm_export(tmp_path / "ckpt", metadata, [groups[0], groups[1] + b"\0\0"])
    assert err.value.field == "groups[1].nbytes"
    assert err.value.expected == len(groups[1]) and err.value.got == len(groups[1]) + 2
    assert not (tmp_path / "ckpt").exists()


def test_write_rejects_a_missing_group(tmp_path):
    metadata, groups = _export()
    with pytest.raises(FieldError, match="2 page groups"):
        write_tvm_export(tmp_path / "ckpt", metadata, groups[:1])


def test_read_rejects_a_missing_group_file(tmp_path):
    write_tvm_export(tmp_path / "ckpt", *_export())
    (tmp_path / "ckpt" / group_file(1)).unlink()
    with pytest.raises(FormatError, match="group_1.bin"):
        read_tvm_export(tmp_path / "ckpt")


def test_read_rejects_a_truncated_group_file(tmp_path):
    metadata, groups = _export()
    write_tvm_export(tmp_path / "ckpt", metadata, groups)
    (tmp_path / "ckpt" / group_file(0)).write_bytes(groups[0][:-1])
    with pytest.raises(FormatError) as err:
        read_tvm_export(tmp_path / "ckpt")
    assert err.value.expected == len(groups[0]) and err.value.got == len(groups[0]) - 1


def test_read_rejects_an_unexpected_file(tmp_path):
    write_tvm_export(tmp_path / "ckpt", *_export())
    (tmp_path / "ckpt" / group_file(2)).write_bytes(b"")
    with pytest.raises(FormatError, match="unexpected file"):
        read_tvm_export(tmp_path / "ckpt")


def test_read_rejects_a_missing_metadata_file(tmp_path):
    write_tvm_export(tmp_path / "ckpt", *_export())
    (tmp_path / "ckpt" / METADATA_FILE).unlink()
    with pytest.raises(FormatError, match="metadata.json"):
        read_tvm_export(tmp_path / "ckpt")


def test_read_rejects_metadata_that_is_not_json(tmp_path):
    write_tvm_export(tmp_path / "ckpt", *_export())
    (tmp_path / "ckpt" / METADATA_FILE).write_text("{not json")
    with pytest.raises(MetadataError, match="valid JSON"):
        read_tvm_export(tmp_path / "ckpt")


def test_read_rejects_metadata_whose_group_nbytes_is_not_an_integer(tmp_path):
    metadata, groups = _export()
    write_tvm_export(tmp_path / "ckpt", metadata, groups)
    bad = json.loads(metadata)
    bad["groups"][0]["nbytes"] = "512"
    (tmp_path / "ckpt" / METADATA_FILE).write_text(json.dumps(bad))
    with pytest.raises(MetadataError) as err:
        read_tvm_export(tmp_path / "ckpt")
    assert err.value.field == "metadata.groups[0].nbytes"


def test_read_of_a_path_that_is_not_a_directory_fails(tmp_path):
    with pytest.raises(FormatError, match="not a directory"):
        read_tvm_export(tmp_path / "nothing")


def test_overwrite_replaces_only_a_tvm_export_directory(tmp_path):
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("mine")
    with pytest.raises(FieldError, match="todo.txt"):
        write_tvm_export(tmp_path / "notes", *_export(), overwrite=True)
    assert (tmp_path / "notes" / "todo.txt").read_text() == "mine"


def test_overwrite_refuses_a_file(tmp_path):
    (tmp_path / "file").write_text("mine")
    with pytest.raises(FieldError, match="regular file"):
        write_tvm_export(tmp_path / "file", *_export(), overwrite=True)
    assert (tmp_path / "file").read_text() == "mine"


def test_overwrite_refuses_a_symlink_and_leaves_its_target(tmp_path):
    write_tvm_export(tmp_path / "real", *_export())
    (tmp_path / "link").symlink_to(tmp_path / "real")
    with pytest.raises(FieldError, match="symbolic link"):
        write_tvm_export(tmp_path / "link", *_export(seq_length=9), overwrite=True)
    assert read_tvm_export(tmp_path / "real").metadata_json == _export()[0]


def _crash_on_rename(monkeypatch, calls: int) -> None:
    """Make the ``calls``-th os.rename of tvm_export raise, as if the process died there; no atomic swap."""
    monkeypatch.setattr(tvm_export, "_exchange", lambda a, b: False)
    real, seen = os.rename, []

    def rename(src, dst):
        seen.append(src)
        if len(seen) == calls:
            raise KeyboardInterrupt("killed")
        real(src, dst)

    monkeypatch.setattr(tvm_export.os, "rename", rename)


def test_a_crash_between_the_renames_of_a_replace_leaves_the_old_export_beside_it(tmp_path, monkeypatch):
    old = _export()
    write_tvm_export(tmp_path / "ckpt", *old)
    _crash_on_rename(monkeypatch, calls=2)
    with pytest.raises(KeyboardInterrupt):
        write_tvm_export(tmp_path / "ckpt", *_export(seq_length=9), overwrite=True)
    (backup,) = [p for p in tmp_path.iterdir() if p.name != "ckpt"]
    assert read_tvm_export(backup).metadata_json == old[0]


def test_the_next_write_puts_a_backed_up_export_back_first(tmp_path, monkeypatch):
    old = _export()
    write_tvm_export(tmp_path / "ckpt", *old)
    _crash_on_rename(monkeypatch, calls=2)
    with pytest.raises(KeyboardInterrupt):
        write_tvm_export(tmp_path / "ckpt", *_export(seq_length=9), overwrite=True)
    monkeypatch.undo()
    with pytest.raises(FieldError, match="does not exist yet"):
        write_tvm_export(tmp_path / "ckpt", *_export(seq_length=9))
    assert read_tvm_export(tmp_path / "ckpt").metadata_json == old[0]
    assert sorted(os.listdir(tmp_path)) == ["ckpt"]


def test_the_next_write_removes_the_temp_directory_of_an_interrupted_one(tmp_path, monkeypatch):
    write_tvm_export(tmp_path / "ckpt", *_export())
    _crash_on_rename(monkeypatch, calls=1)
    with pytest.raises(KeyboardInterrupt):
        write_tvm_export(tmp_path / "other", *_export())
    monkeypatch.undo()
    write_tvm_export(tmp_path / "other", *_export(seq_length=9))
    assert sorted(os.listdir(tmp_path)) == ["ckpt", "other"]


def test_replace_swaps_atomically_where_the_platform_can(tmp_path, monkeypatch):
    write_tvm_export(tmp_path / "ckpt", *_export())
    if not tvm_export._exchange(tmp_path / "ckpt", tmp_path / "ckpt"):
        pytest.skip("no renameat2(RENAME_EXCHANGE) here")
    monkeypatch.setattr(tvm_export.os, "rename", lambda a, b: pytest.fail(f"renamed {a} -> {b}"))
    new = _export(seq_length=9)
    write_tvm_export(tmp_path / "ckpt", *new, overwrite=True)
    assert read_tvm_export(tmp_path / "ckpt").metadata_json == new[0]
    assert sorted(os.listdir(tmp_path)) == ["ckpt"]


def test_read_refuses_a_fifo_as_group_file_without_blocking(tmp_path, unblock_fifo):
    write_tvm_export(tmp_path / "ckpt", *_export())
    os.unlink(tmp_path / "ckpt" / group_file(1))
    unblock_fifo(tmp_path / "ckpt" / group_file(1))
    with pytest.raises(FormatError, match="FIFO"):
        read_tvm_export(tmp_path / "ckpt")


def test_read_checks_a_group_file_size_before_reading_it(tmp_path, monkeypatch):
    write_tvm_export(tmp_path / "ckpt", *_export())
    os.truncate(tmp_path / "ckpt" / group_file(0), 20 << 30)  # sparse: 20 GiB that would not fit in memory
    with pytest.raises(FormatError, match=f"{group_file(0)}.size"):
        read_tvm_export(tmp_path / "ckpt")


def test_read_refuses_a_metadata_file_larger_than_any_metadata_before_reading_it(tmp_path):
    write_tvm_export(tmp_path / "ckpt", *_export())
    os.truncate(tmp_path / "ckpt" / METADATA_FILE, 20 << 30)
    with pytest.raises(FormatError, match=f"at most {MAX_METADATA_BYTES} bytes"):
        read_tvm_export(tmp_path / "ckpt")


def test_read_refuses_a_metadata_file_that_is_a_device(tmp_path):
    write_tvm_export(tmp_path / "ckpt", *_export())
    os.unlink(tmp_path / "ckpt" / METADATA_FILE)
    (tmp_path / "ckpt" / METADATA_FILE).symlink_to("/dev/zero")
    with pytest.raises(FormatError, match="character device"):
        read_tvm_export(tmp_path / "ckpt")


def test_write_refuses_a_checkpoint_of_sliding_window_layers_which_tvm_cannot_take(tmp_path):
    layout = KVLayout(page_size=4, num_layers=2, num_qo_heads=4, num_kv_heads=2, qk_head_dim=8,
                      attn_kinds=("mha_sliding", "mha"), support_layer_sliding_window=True, sliding_window=8)
    metadata = write_metadata(layout, CacheLimits(4, 64, 64), 0, 6)
    groups = [bytes(2 * layout.page_bytes)] * 2
    with pytest.raises(UnsupportedLayoutError, match="TVM's checkpoints .* sliding-window"):
        write_tvm_export(tmp_path / "ckpt", metadata, groups)
    assert not (tmp_path / "ckpt").exists()
