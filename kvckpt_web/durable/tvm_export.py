"""TVM export directories: ``metadata.json`` (TVM's exact text) + ``group_<i>.bin`` (raw little-endian group i).

This is the plain on-disk form of one TVM checkpoint: what a TVM program writes
after ``get_checkpoint_metadata`` and ``export_page_group`` and reads back before
``prepare_import`` / ``import_page_group``. Writing is crash-safe: files go to a
temporary directory that is fsynced and renamed into place.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from ..errors import FormatError, MetadataError
from ..stores.store import fsync_dir
from ..tvm.metadata import parse_metadata

METADATA_FILE = "metadata.json"
_GROUP_FILE = re.compile(r"group_(\d+)\.bin")


def group_file(index: int) -> str:
    """File name of page group ``index``."""
    return f"group_{index}.bin"


@dataclass(frozen=True)
class TVMExport:
    """One TVM checkpoint in memory: the metadata text and every page group's bytes."""

    metadata_json: str
    groups: list[bytes]

    @property
    def metadata(self) -> dict[str, Any]:
        """The parsed metadata object."""
        return parse_metadata(self.metadata_json)


def _group_sizes(metadata: dict[str, Any]) -> list[int]:
    groups = metadata.get("groups")
    if not isinstance(groups, list):
        raise MetadataError("metadata.groups", "a JSON array", type(groups).__name__)
    sizes = []
    for i, group in enumerate(groups):
        nbytes = group.get("nbytes") if isinstance(group, dict) else None
        if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
            raise MetadataError(f"metadata.groups[{i}].nbytes", "a non-negative integer", nbytes)
        sizes.append(nbytes)
    return sizes


def write_tvm_export(path: str | os.PathLike, metadata_json: str, groups: Sequence[Any], *,
                     overwrite: bool = False) -> Path:
    """Write a TVM export directory at ``path`` atomically; FormatError if a group's size disagrees with the metadata."""
    path = Path(path)
    sizes = _group_sizes(parse_metadata(metadata_json))
    if len(groups) != len(sizes):
        raise FormatError("groups", f"{len(sizes)} page groups (metadata.groups)", len(groups))
    for i, (group, size) in enumerate(zip(groups, sizes)):
        if memoryview(group).nbytes != size:
            raise FormatError(f"groups[{i}].nbytes", size, memoryview(group).nbytes)
    if path.exists() and not overwrite:
        raise FormatError(str(path), "a path that does not exist yet (replace it with --force, or overwrite=True)", "existing")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        for name, data in [(METADATA_FILE, metadata_json.encode("utf-8"))] + [
                (group_file(i), g) for i, g in enumerate(groups)]:
            with open(tmp / name, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
        fsync_dir(tmp)
        if path.exists():
            shutil.rmtree(path)
        os.rename(tmp, path)
        fsync_dir(path.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path


def read_tvm_export(path: str | os.PathLike) -> TVMExport:
    """Read a TVM export directory; FormatError for a missing, extra or wrongly sized file."""
    path = Path(path)
    if not path.is_dir():
        raise FormatError(str(path), "a TVM export directory", "not a directory")
    meta_path = path / METADATA_FILE
    if not meta_path.is_file():
        raise FormatError(str(meta_path), "a metadata.json file", "missing")
    raw = meta_path.read_bytes()
    metadata = parse_metadata(raw)
    sizes = _group_sizes(metadata)
    for entry in sorted(os.listdir(path)):
        match = _GROUP_FILE.fullmatch(entry)
        if entry != METADATA_FILE and (match is None or int(match.group(1)) >= len(sizes)
                                       or entry != group_file(int(match.group(1)))):
            raise FormatError(str(path / entry), f"only {METADATA_FILE} and group_0..{len(sizes) - 1}.bin",
                              "an unexpected file")
    groups = []
    for i, size in enumerate(sizes):
        file = path / group_file(i)
        if not file.is_file():
            raise FormatError(str(file), f"a page group file of {size} bytes", "missing")
        data = file.read_bytes()
        if len(data) != size:
            raise FormatError(f"{file}.size", size, len(data), "metadata.groups[].nbytes disagrees with the file")
        groups.append(data)
    return TVMExport(raw.decode("utf-8"), groups)
