"""TVM export directories: ``metadata.json`` (TVM's exact text) + ``group_<i>.bin`` (raw little-endian group i).

This is the plain on-disk form of one TVM checkpoint: what a TVM program writes
after ``get_checkpoint_metadata`` and ``export_page_group`` and reads back before
``prepare_import`` / ``import_page_group``. Writing is crash-safe: files go to a
temporary directory that is fsynced and renamed into place; a replaced export
stays whole until the new one is in place. Reading checks each file's type and
size before it reads a byte.
"""

from __future__ import annotations

import errno
import os
import re
import secrets
import shutil
import stat
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from ..checks import check_bool, check_buffer, check_each, check_path
from ..errors import FieldError, FormatError, MetadataError, is_int
from ..stores.file import file_kind, fsync_dir
from ..tvm.metadata import layout_from_metadata, parse_metadata

METADATA_FILE = "metadata.json"
MAX_METADATA_BYTES = 1 << 20
"""Longest ``metadata.json`` a reader accepts (TVM's metadata of any real cache is a few KiB)."""

_GROUP_FILE = re.compile(r"group_(\d+)\.bin")
_NEW, _OLD = "kvckpt-new", "kvckpt-old"  # the temp and backup directories beside an export being written


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
        if not is_int(nbytes, 0):
            raise MetadataError(f"metadata.groups[{i}].nbytes", "a non-negative integer", nbytes)
        sizes.append(nbytes)
    return sizes


def _export_entries(path: Path) -> list[str] | None:
    """The entries of directory ``path`` if each is ``metadata.json`` or a ``group_<i>.bin``; else None."""
    if path.is_symlink() or not path.is_dir():
        return None
    entries = os.listdir(path)
    return entries if all(e == METADATA_FILE or _group_index(e) is not None for e in entries) else None


def _group_index(name: str) -> int | None:
    """``i`` if ``name`` is ``group_<i>.bin`` as :func:`group_file` writes it, else None."""
    match = _GROUP_FILE.fullmatch(name)
    return int(match.group(1)) if match is not None and name == group_file(int(match.group(1))) else None


def is_tvm_export(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a TVM export directory by its files: metadata.json and group_<i>.bin, nothing else."""
    entries = _export_entries(Path(path))
    return entries is not None and METADATA_FILE in entries


def check_replaceable(path: str | os.PathLike) -> None:
    """Raise :class:`FieldError` unless :func:`write_tvm_export` may replace ``path``: missing, an empty
    directory or a TVM export directory (anything else, a store included, is someone's data)."""
    path = Path(path)
    if not os.path.lexists(path) or (not path.is_symlink() and path.is_dir() and not os.listdir(path)):
        return
    if is_tvm_export(path):
        return
    if path.is_symlink() or not path.is_dir():
        got = "a symbolic link" if path.is_symlink() else file_kind(path.stat().st_mode)
    else:
        names = sorted(os.listdir(path))
        got = f"a directory holding {', '.join(names[:5])}" + (f" and {len(names) - 5} more" if len(names) > 5 else "")
    raise FieldError(str(path), f"a TVM export directory ({METADATA_FILE}, group_<i>.bin) to replace", got)


def _beside(path: Path, kind: str) -> list[Path]:
    """This module's temp (``kind`` _NEW) or backup (_OLD) directories for ``path`` in its parent."""
    prefix = f".{path.name}.{kind}."
    return sorted(path.parent / e for e in os.listdir(path.parent) if e.startswith(prefix)
                  and _export_entries(path.parent / e) is not None)


def _recover(path: Path) -> None:
    """Finish what an interrupted :func:`write_tvm_export` to ``path`` left: put a backed-up export back
    if ``path`` is missing, then remove the temp and backup directories (only ones holding export files)."""
    if not path.parent.is_dir():
        return
    if not os.path.lexists(path):
        for old in _beside(path, _OLD):
            if is_tvm_export(old):
                os.rename(old, path)
                fsync_dir(path.parent)
                break
    for stale in _beside(path, _NEW) + _beside(path, _OLD):
        shutil.rmtree(stale)


def _exchange(a: Path, b: Path) -> bool:
    """Swap the names ``a`` and ``b`` atomically (Linux ``renameat2(RENAME_EXCHANGE)``); False where unsupported."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    renameat2 = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    if renameat2 is None:
        return False
    at_fdcwd, rename_exchange = -100, 2
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):  # an old kernel, or a file system without it
        return False
    raise OSError(err, os.strerror(err), str(a), None, str(b))


def _replace(tmp: Path, path: Path) -> None:
    """Put the directory ``tmp`` in place of ``path``; an export at ``path`` stays whole until the new one is
    there: it is swapped out atomically, or renamed to a backup beside it that :func:`_recover` puts back."""
    if not os.path.lexists(path):
        os.rename(tmp, path)
        fsync_dir(path.parent)
        return
    if _exchange(tmp, path):
        fsync_dir(path.parent)
        shutil.rmtree(tmp)  # the old export, now under the temp name
        return
    old = path.parent / f".{path.name}.{_OLD}.{secrets.token_hex(8)}"
    os.rename(path, old)
    os.rename(tmp, path)
    fsync_dir(path.parent)
    shutil.rmtree(old)


def write_tvm_export(path: str | os.PathLike, metadata_json: str, groups: Sequence[Any], *,
                     overwrite: bool = False) -> Path:
    """Write a TVM export directory at ``path`` atomically; FieldError if a group's size disagrees with the metadata,
    UnsupportedLayoutError (nothing written) if TVM cannot take the metadata's layout (sliding-window layers).

    ``overwrite`` replaces only what :func:`check_replaceable` allows (an empty directory or another TVM export
    directory). A crash leaves the old export or the new one at ``path``, or (crashed between two renames
    where the platform cannot swap directories atomically) the old one in a backup directory beside it,
    which the next write to ``path`` puts back before it starts; it also removes the temp directories of
    interrupted writes.
    """
    path = Path(check_path("path", path))
    views = check_each("groups", groups, "a list of page groups (bytes-like), one per layer", check_buffer)
    check_bool("overwrite", overwrite)
    metadata = parse_metadata(metadata_json)
    layout_from_metadata(metadata).check_tvm_checkpointable()
    sizes = _group_sizes(metadata)
    if len(views) != len(sizes):
        raise FieldError("groups", f"{len(sizes)} page groups (metadata.groups)", len(views))
    for i, (view, size) in enumerate(zip(views, sizes)):
        if view.nbytes != size:
            raise FieldError(f"groups[{i}].nbytes", size, view.nbytes)
    _recover(path)
    if os.path.lexists(path) and not overwrite:
        raise FieldError(str(path), "a path that does not exist yet (replace it with --force, or overwrite=True)", "existing")
    check_replaceable(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.{_NEW}.{secrets.token_hex(8)}"
    tmp.mkdir()
    try:
        for name, data in [(METADATA_FILE, metadata_json.encode("utf-8"))] + [
                (group_file(i), g) for i, g in enumerate(views)]:
            with open(tmp / name, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
        fsync_dir(tmp)
        _replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path


def _read_file(file: Path, what: str, *, size: int | None = None, max_bytes: int | None = None) -> bytes:
    """The bytes of the regular file ``file``, checked to be ``size`` bytes or at most ``max_bytes`` before
    any is read; FormatError naming the file otherwise (missing, a FIFO, a device, a wrong size)."""
    try:
        fd = os.open(file, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except (FileNotFoundError, NotADirectoryError):
        raise FormatError(str(file), what, "missing") from None
    with open(fd, "rb", buffering=0) as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise FormatError(str(file), what, file_kind(st.st_mode))
        if size is not None and st.st_size != size:
            raise FormatError(f"{file}.size", size, st.st_size, "metadata.groups[].nbytes disagrees with the file")
        if max_bytes is not None and st.st_size > max_bytes:
            raise FormatError(f"{file}.size", f"at most {max_bytes} bytes", st.st_size)
        limit = size if size is not None else max_bytes
        data = f.read() if limit is None else f.read(limit + 1)
    if size is not None and len(data) != size:
        raise FormatError(f"{file}.size", size, len(data), "the file changed while being read")
    if max_bytes is not None and len(data) > max_bytes:
        raise FormatError(f"{file}.size", f"at most {max_bytes} bytes", len(data))
    return data


def read_tvm_metadata(path: str | os.PathLike) -> bytes:
    """The bytes of the ``metadata.json`` of the TVM export directory ``path``, checked to be a regular file of
    at most :data:`MAX_METADATA_BYTES` before any is read."""
    return _read_file(Path(path) / METADATA_FILE, f"a {METADATA_FILE} file", max_bytes=MAX_METADATA_BYTES)


def read_tvm_export(path: str | os.PathLike) -> TVMExport:
    """Read a TVM export directory; FormatError for a missing, extra, wrongly sized or not regular file."""
    path = Path(check_path("path", path))
    if not path.is_dir():
        raise FormatError(str(path), "a TVM export directory", "not a directory")
    raw = read_tvm_metadata(path)
    metadata = parse_metadata(raw)
    sizes = _group_sizes(metadata)
    for entry in sorted(os.listdir(path)):
        index = _group_index(entry)
        if entry != METADATA_FILE and (index is None or index >= len(sizes)):
            raise FormatError(str(path / entry), f"only {METADATA_FILE} and group_0..{len(sizes) - 1}.bin",
                              "an unexpected file")
    groups = [_read_file(path / group_file(i), f"a page group file of {size} bytes", size=size)
              for i, size in enumerate(sizes)]
    return TVMExport(raw.decode("utf-8"), groups)
