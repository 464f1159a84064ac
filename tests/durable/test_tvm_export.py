"""TVM export directories: metadata.json verbatim + group_<i>.bin, strict on read, atomic on write."""

from __future__ import annotations

import json
import os

import pytest

from kvckpt_web.durable.tvm_export import METADATA_FILE, group_file, read_tvm_export, write_tvm_export
from kvckpt_web.errors import FormatError, MetadataError
from kvckpt_web.tvm.layout import CacheLimits, KVLayout
from kvckpt_web.tvm.metadata import write_metadata

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
    with pytest.raises(FormatError, match="does not exist yet"):
        write_tvm_export(tmp_path / "ckpt", metadata, groups)
    other, other_groups = _export(seq_length=9)
    write_tvm_export(tmp_path / "ckpt", other, other_groups, overwrite=True)
    assert read_tvm_export(tmp_path / "ckpt").metadata_json == other


def test_write_rejects_a_group_whose_size_disagrees_with_the_metadata(tmp_path):
    metadata, groups = _export()
    with pytest.raises(FormatError) as err:
        write_tvm_export(tmp_path / "ckpt", metadata, [groups[0], groups[1] + b"\0\0"])
    assert err.value.field == "groups[1].nbytes"
    assert err.value.expected == len(groups[1]) and err.value.got == len(groups[1]) + 2
    assert not (tmp_path / "ckpt").exists()


def test_write_rejects_a_missing_group(tmp_path):
    metadata, groups = _export()
    with pytest.raises(FormatError, match="2 page groups"):
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
