"""The GGUF reader: the real SmolLM2 file field by field against gguf.GGUFReader, and one bad file per error."""

from __future__ import annotations

import hashlib
import mmap
import struct
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest

from kvckpt_web.errors import FormatError
from kvckpt_web.model.gguf import GGML_TYPES, GGUFFile, open_gguf, parse_gguf

SMOLLM_DIGEST = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"

VT = gguf.GGUFValueType
Q4_1 = gguf.GGMLQuantizationType.Q4_1


# ---------------------------------------------------------------- the real file against gguf's reader

@pytest.fixture(scope="module")
def reference(smollm_path: Path) -> gguf.GGUFReader:
    return gguf.GGUFReader(smollm_path)


def test_real_file_version_matches_reference(smollm: GGUFFile, reference: gguf.GGUFReader) -> None:
    assert smollm.version == reference.fields["GGUF.version"].contents() == 3


def test_real_file_has_every_metadata_key_in_file_order(smollm: GGUFFile, reference: gguf.GGUFReader) -> None:
    keys = [k for k in reference.fields if not k.startswith("GGUF.")]
    assert list(smollm.metadata) == keys


def test_real_file_metadata_values_equal_reference(smollm: GGUFFile, reference: gguf.GGUFReader) -> None:
    for key, value in smollm.metadata.items():
        expected = reference.fields[key].contents()
        assert value == expected, key
        assert type(value) is type(expected) or isinstance(expected, np.floating), key


def test_real_file_tensor_table_equals_reference(smollm: GGUFFile, reference: gguf.GGUFReader) -> None:
    assert list(smollm.tensors) == [t.name for t in reference.tensors]
    for ref in reference.tensors:
        t = smollm.tensors[ref.name]
        assert (t.type, t.type_name) == (int(ref.tensor_type), ref.tensor_type.name), ref.name
        assert t.shape == tuple(int(n) for n in ref.shape), ref.name
        assert smollm.data_offset + t.offset == ref.data_offset, ref.name
        assert t.nbytes == ref.n_bytes == len(t.data), ref.name
        assert t.num_elements == ref.n_elements, ref.name


def test_real_file_tensor_data_equals_reference(smollm: GGUFFile, reference: gguf.GGUFReader) -> None:
    for ref in reference.tensors:
        assert smollm.tensors[ref.name].data == ref.data.tobytes(), ref.name


def test_real_file_known_facts(smollm: GGUFFile) -> None:
    embd = smollm.tensors["token_embd.weight"]
    assert (embd.type_name, embd.shape) == ("Q8_0", (576, 49152))
    assert smollm.field("llama.block_count", int) == 30
    assert len(smollm.field("tokenizer.ggml.tokens", list, str)) == 49152


def test_real_file_digest_is_pinned(smollm: GGUFFile) -> None:
    assert smollm.digest == SMOLLM_DIGEST


# ---------------------------------------------------------------- small files made with gguf.GGUFWriter

def write_gguf(path: Path, extra: dict[str, tuple[Any, gguf.GGUFValueType]] | None = None,
               alignment: int | None = None) -> bytes:
    """A small GGUF with one metadata value of every type and three tensors; its bytes."""
    w = gguf.GGUFWriter(path, "llama")
    w.add_uint8("test.uint8", 200)
    w.add_int8("test.int8", -100)
    w.add_uint16("test.uint16", 60000)
    w.add_int16("test.int16", -30000)
    w.add_uint32("test.uint32", 4_000_000_000)
    w.add_int32("test.int32", -2_000_000_000)
    w.add_float32("test.float32", 0.5)
    w.add_bool("test.bool", True)
    w.add_string("test.string", "héllo ✓")
    w.add_uint64("test.uint64", 2**64 - 1)
    w.add_int64("test.int64", -(2**63))
    w.add_float64("test.float64", 0.1)
    w.add_array("test.strings", ["a", "", "ü"])
    w.add_array("test.ints", [1, 2, 3])
    for key, (value, vtype) in (extra or {}).items():
        w.add_key_value(key, value, vtype)
    if alignment is not None:
        w.add_custom_alignment(alignment)
    w.add_tensor("tensor.alpha", np.arange(16, dtype=np.float32).reshape(2, 8))
    w.add_tensor("tensor.beta", np.arange(80, dtype=np.uint8).reshape(2, 40), raw_dtype=Q4_1)
    w.add_tensor("tensor.gamma", np.ones(3, dtype=np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path.read_bytes()


@pytest.fixture()
def small(tmp_path: Path) -> bytes:
    return write_gguf(tmp_path / "small.gguf")


def patched(data: bytes, offset: int, fmt: str, value: Any) -> bytes:
    out = bytearray(data)
    struct.pack_into("<" + fmt, out, offset, value)
    return bytes(out)


def after(data: bytes, text: bytes) -> int:
    """Offset just past the only occurrence of ``text`` in ``data``."""
    assert data.count(text) == 1
    return data.index(text) + len(text)


def tensor_info(data: bytes, name: str) -> dict[str, int]:
    """Offsets of the fields of tensor ``name``'s table entry."""
    pos = after(data, name.encode())
    n_dims = struct.unpack_from("<I", data, pos)[0]
    return {"n_dims": pos, "shape": pos + 4, "type": pos + 4 + 8 * n_dims, "offset": pos + 8 + 8 * n_dims,
            "end": pos + 16 + 8 * n_dims}


def expect_error(data: bytes, field: str, message_part: str = "") -> FormatError:
    with pytest.raises(FormatError) as info:
        parse_gguf(data)
    assert info.value.field == field
    assert message_part in str(info.value)
    return info.value


def test_small_file_metadata_round_trips_every_value_type(small: bytes) -> None:
    md = parse_gguf(small).metadata
    assert md["test.uint8"] == 200 and md["test.int8"] == -100
    assert md["test.uint16"] == 60000 and md["test.int16"] == -30000
    assert md["test.uint32"] == 4_000_000_000 and md["test.int32"] == -2_000_000_000
    assert md["test.uint64"] == 2**64 - 1 and md["test.int64"] == -(2**63)
    assert md["test.float32"] == 0.5 and md["test.float64"] == 0.1
    assert md["test.bool"] is True and md["test.string"] == "héllo ✓"
    assert md["test.strings"] == ["a", "", "ü"] and md["test.ints"] == [1, 2, 3]
    assert md["general.architecture"] == "llama"


def test_small_file_nested_arrays_are_read(tmp_path: Path) -> None:
    data = write_gguf(tmp_path / "n.gguf", {"test.nested": ([[1, 2], [3]], VT.ARRAY)})
    assert parse_gguf(data).metadata["test.nested"] == [[1, 2], [3]]


def test_small_file_tensors_sized_from_block_sizes(small: bytes) -> None:
    f = parse_gguf(small)
    alpha, beta, gamma = f.tensors.values()
    assert (alpha.type_name, alpha.shape, alpha.nbytes) == ("F32", (8, 2), 64)
    assert (beta.type_name, beta.shape, beta.nbytes) == ("Q4_1", (64, 2), 80)
    assert (gamma.type_name, gamma.shape, gamma.nbytes) == ("F16", (3,), 6)
    assert bytes(beta.data) == bytes(range(80))
    assert np.frombuffer(alpha.data, np.float32).tolist() == list(range(16))


def test_every_buffer_kind_gives_the_same_file(small: bytes, tmp_path: Path) -> None:
    path = tmp_path / "copy.gguf"
    path.write_bytes(small)
    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        parsed = [parse_gguf(b) for b in (small, bytearray(small), memoryview(small), mapped)]
        first = parsed[0]
        for other in parsed[1:] + [open_gguf(path)]:
            assert (other.version, other.metadata, other.digest) == (first.version, first.metadata, first.digest)
            assert [(t.name, t.shape, t.offset, bytes(t.data)) for t in other.tensors.values()] == \
                   [(t.name, t.shape, t.offset, bytes(t.data)) for t in first.tensors.values()]
        del parsed, first, other  # release the views before the mapping closes


def test_tensor_data_is_a_view_not_a_copy(small: bytes) -> None:
    buffer = bytearray(small)
    beta = parse_gguf(buffer).tensors["tensor.beta"]
    f = parse_gguf(small)
    buffer[f.data_offset + f.tensors["tensor.beta"].offset] ^= 0xFF
    assert bytes(beta.data) != bytes(range(80))


def test_data_offset_and_tensor_offsets_respect_custom_alignment(tmp_path: Path) -> None:
    f = parse_gguf(write_gguf(tmp_path / "a.gguf", alignment=64))
    assert f.alignment == 64 and f.data_offset % 64 == 0
    assert all(t.offset % 64 == 0 for t in f.tensors.values())


def test_version_2_is_read(small: bytes) -> None:
    assert parse_gguf(patched(small, 4, "I", 2)).version == 2


def test_digest_covers_header_metadata_table_and_data(small: bytes) -> None:
    f = parse_gguf(small)
    table_end = tensor_info(small, "tensor.gamma")["end"]
    assert f.digest == hashlib.sha256(small[:table_end] + small[f.data_offset:]).hexdigest()


def test_digest_changes_with_metadata(small: bytes) -> None:
    other = small.replace("héllo".encode(), b"hallo!")  # same length, other text
    assert parse_gguf(other).digest != parse_gguf(small).digest


def test_digest_changes_with_one_bit_of_tensor_data(small: bytes) -> None:
    other = small[:-1] + bytes([small[-1] ^ 1])
    assert parse_gguf(other).digest != parse_gguf(small).digest


# ---------------------------------------------------------------- metadata accessor

def test_field_returns_a_value_of_the_asked_type(small: bytes) -> None:
    assert parse_gguf(small).field("test.strings", list, str) == ["a", "", "ü"]


def test_field_missing_key_names_it(small: bytes) -> None:
    with pytest.raises(FormatError, match="no.such.key: .*key missing"):
        parse_gguf(small).field("no.such.key", int)


def test_field_of_another_type_names_key_and_types(small: bytes) -> None:
    with pytest.raises(FormatError, match="test.string: expected a metadata value of type int, got 'str'"):
        parse_gguf(small).field("test.string", int)


def test_field_bool_is_not_an_int(small: bytes) -> None:
    with pytest.raises(FormatError, match="test.bool"):
        parse_gguf(small).field("test.bool", int)


def test_field_list_items_are_checked(small: bytes) -> None:
    with pytest.raises(FormatError, match=r"test.ints\[0\]: expected a str"):
        parse_gguf(small).field("test.ints", list, str)


# ---------------------------------------------------------------- one bad file per error variant

def test_bad_magic_is_not_a_gguf_file(small: bytes) -> None:
    expect_error(b"GGML" + small[4:], "header.magic", "not a GGUF file")


def test_empty_file_is_not_a_gguf_file(tmp_path: Path) -> None:
    (tmp_path / "empty.gguf").write_bytes(b"")
    with pytest.raises(FormatError, match="header.magic"):
        open_gguf(tmp_path / "empty.gguf")


@pytest.mark.parametrize("version", [1, 4, 0x03000000])
def test_unsupported_version(small: bytes, version: int) -> None:
    expect_error(patched(small, 4, "I", version), "header.version", "unsupported GGUF version")


def test_truncated_header(small: bytes) -> None:
    expect_error(small[:20], "header.kv_count", "truncated")


def test_truncated_metadata(small: bytes) -> None:
    expect_error(small[:after(small, b"test.string\x08") + 3 + 8 + 2], "metadata['test.string']", "truncated")


def test_truncated_tensor_table(small: bytes) -> None:
    expect_error(small[:tensor_info(small, "tensor.beta")["type"] + 2], "tensors['tensor.beta'].type", "truncated")


def test_truncated_data(small: bytes) -> None:
    f = parse_gguf(small)
    gamma_end = f.data_offset + f.tensors["tensor.gamma"].offset + 6
    expect_error(small[:gamma_end - 1], "tensors['tensor.gamma']", "truncated")


def test_kv_count_past_the_buffer_is_refused_before_reading(small: bytes) -> None:
    expect_error(patched(small, 16, "Q", 2**62), "header.kv_count", "what the remaining bytes can hold")


def test_tensor_count_past_the_buffer_is_refused_before_reading(small: bytes) -> None:
    expect_error(patched(small, 8, "Q", 2**40), "header.tensor_count", "what the remaining bytes can hold")


def test_string_length_past_the_buffer(small: bytes) -> None:
    key_length_at = small.index(b"test.uint8") - 8
    expect_error(patched(small, key_length_at, "Q", 2**63), "metadata[1].key", "truncated")


def test_array_count_past_the_buffer(small: bytes) -> None:
    count_at = after(small, b"test.strings") + 4 + 4
    expect_error(patched(small, count_at, "Q", 2**60), "metadata['test.strings'] count", "remaining bytes")


def test_unknown_value_type(small: bytes) -> None:
    expect_error(patched(small, after(small, b"test.uint8"), "I", 13), "metadata['test.uint8'] type", "13")


def test_unknown_array_item_type(small: bytes) -> None:
    expect_error(patched(small, after(small, b"test.ints") + 4, "I", 99), "metadata['test.ints'] item type")


def test_invalid_utf8_string(small: bytes) -> None:
    expect_error(small.replace("héllo".encode(), b"h\xff\xfello"), "metadata['test.string']", "UTF-8")


def test_bool_byte_other_than_0_or_1(small: bytes) -> None:
    expect_error(patched(small, after(small, b"test.bool") + 4, "B", 2), "metadata['test.bool']", "0 or 1")


def test_duplicate_key(small: bytes) -> None:
    expect_error(small.replace(b"test.int16", b"test.uint8"), "metadata[4].key")


def test_arrays_nested_too_deep(tmp_path: Path) -> None:
    value: Any = [1]
    for _ in range(8):
        value = [value]
    data = write_gguf(tmp_path / "deep.gguf", {"test.deep": (value, VT.ARRAY)})
    expect_error(data, "metadata['test.deep']" + "[0]" * 8, "nested at most 8 deep")


@pytest.mark.parametrize("alignment", [0, 3, 48])
def test_alignment_not_a_power_of_two(tmp_path: Path, alignment: int) -> None:
    data = write_gguf(tmp_path / "al.gguf", {"general.alignment": (alignment, VT.UINT32)})
    expect_error(data, "general.alignment", "a power of two")


def test_alignment_of_another_type(tmp_path: Path) -> None:
    expect_error(write_gguf(tmp_path / "al.gguf", {"general.alignment": ("32", VT.STRING)}), "general.alignment")


def test_unknown_tensor_type(small: bytes) -> None:
    expect_error(patched(small, tensor_info(small, "tensor.alpha")["type"], "I", 4),
                 "tensors['tensor.alpha'].type", "known ggml type")


@pytest.mark.parametrize("n_dims", [0, 5])
def test_tensor_dimension_count_out_of_range(small: bytes, n_dims: int) -> None:
    expect_error(patched(small, tensor_info(small, "tensor.alpha")["n_dims"], "I", n_dims),
                 "tensors['tensor.alpha'].n_dims")


def test_tensor_row_not_a_whole_number_of_blocks(small: bytes) -> None:
    expect_error(patched(small, tensor_info(small, "tensor.beta")["shape"], "Q", 48),
                 "tensors['tensor.beta'].shape[0]", "block size 32")


def test_misaligned_tensor_offset(small: bytes) -> None:
    at = tensor_info(small, "tensor.beta")["offset"]
    expect_error(patched(small, at, "Q", struct.unpack_from("<Q", small, at)[0] + 4),
                 "tensors['tensor.beta'].offset", "multiple of the alignment 32")


def test_overlapping_tensors(small: bytes) -> None:
    expect_error(patched(small, tensor_info(small, "tensor.beta")["offset"], "Q", 32),
                 "tensors['tensor.beta'].offset", "tensors overlap")


def test_tensor_outside_the_data_section(small: bytes) -> None:
    expect_error(patched(small, tensor_info(small, "tensor.alpha")["offset"], "Q", 2**40),
                 "tensors['tensor.alpha']", "inside the data section")


def test_duplicate_tensor_name(small: bytes) -> None:
    expect_error(small.replace(b"tensor.gamma", b"tensor.alpha"), "tensors.name", "tensor.alpha")


def test_every_listed_type_sizes_whole_blocks() -> None:
    for type_id, t in GGML_TYPES.items():
        assert gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(type_id)] == (t.block_size, t.type_size), t.name
        assert gguf.GGMLQuantizationType(type_id).name == t.name
