"""A GGUF that would load and then fail mid-reply or produce garbage is refused at load, naming the key or tensor:
a vocabulary of another size than the embedding, a non-finite RoPE base or RMS epsilon, NaN or infinite weights."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest
from tiny_llama import write_tiny_llama

from kvckpt_web.errors import FormatError
from kvckpt_web.model.config import LlamaConfig
from kvckpt_web.model.gguf import GGUFFile, open_gguf
from kvckpt_web.model.llama_tensors import check_tensors
from kvckpt_web.model.loader import load_model
from kvckpt_web.errors import TensorError
from kvckpt_web.model.weights import (BF16, DEVICE_FORMS, F16, F16_HIGH_BYTES, F32, Q4_1, Q8_0, check_finite,
                                      upload_tensor)

INF16, NAN16, MAX16 = b"\x00\x7c", b"\x01\x7e", b"\xff\x7b"  # little-endian float16: +inf, a NaN, 65504


def test_the_real_smollm2_weights_are_all_finite(smollm: GGUFFile) -> None:
    check_tensors(smollm, LlamaConfig.from_gguf(smollm))


# ----- the vocabulary --------------------------------------------------------------------------------------


@pytest.mark.parametrize("extra_rows, tokens", [(5, "smaller"), (-5, "larger")])
def test_a_tokenizer_of_another_size_than_the_embedding_is_refused(device, tmp_path, extra_rows, tokens):
    def resize(tensors):  # type: ignore[no-untyped-def]
        values, qtype = tensors["token_embd.weight"]
        tensors["token_embd.weight"] = (np.vstack([values, values[:extra_rows]]) if extra_rows > 0
                                        else values[:extra_rows], qtype)

    path = write_tiny_llama(tmp_path / f"{tokens}.gguf", edit=resize)
    rows = open_gguf(path).tensors["token_embd.weight"].shape[1]
    with pytest.raises(FormatError, match=rf"tokenizer\.ggml\.tokens: expected {rows} tokens \(one per row of "
                                          rf"token_embd\.weight\), got '{rows - extra_rows} tokens'"):
        load_model(path, device)


# ----- hyper-parameters ------------------------------------------------------------------------------------


@pytest.mark.parametrize("theta", [float("inf"), float("nan"), 0.0, -10000.0])
def test_a_rope_base_that_is_not_finite_and_positive_is_refused(device, tmp_path, theta):
    path = write_tiny_llama(tmp_path / "theta.gguf", metadata={"rope.freq_base": theta})
    with pytest.raises(FormatError, match="llama.rope.freq_base: expected a finite positive number"):
        load_model(path, device)


@pytest.mark.parametrize("eps", [float("inf"), float("nan"), 0.0, -1e-5])
def test_an_rms_epsilon_that_is_not_finite_and_positive_is_refused(device, tmp_path, eps):
    path = write_tiny_llama(tmp_path / "eps.gguf", metadata={"attention.layer_norm_rms_epsilon": eps})
    with pytest.raises(FormatError, match="llama.attention.layer_norm_rms_epsilon"):
        load_model(path, device)


# ----- weights ---------------------------------------------------------------------------------------------


def test_a_nan_in_an_f32_tensor_is_refused_naming_it_and_the_element(device, tmp_path):
    def poison(tensors):  # type: ignore[no-untyped-def]
        values, qtype = tensors["blk.1.ffn_norm.weight"]
        values = np.array(values, np.float32)
        values.reshape(-1)[7] = np.nan
        tensors["blk.1.ffn_norm.weight"] = (values, qtype)

    path = write_tiny_llama(tmp_path / "nan.gguf", edit=poison)
    with pytest.raises(FormatError, match=r"tensors\['blk\.1\.ffn_norm\.weight'\]: expected finite values, "
                                          r"got 'nan at element 7'"):
        load_model(path, device)


def with_half(src: Path, dst: Path, name: str, block: int, offset: int, half: bytes) -> Path:
    """A copy of GGUF ``src`` whose tensor ``name`` holds float16 ``half`` at byte ``offset`` of block ``block``."""
    f = open_gguf(src)
    t = f.tensors[name]
    size = {Q4_1: 20, Q8_0: 34}[t.type]
    data = bytearray(src.read_bytes())
    start = f.data_offset + t.offset + block * size + offset
    data[start:start + 2] = half
    dst.write_bytes(data)
    return dst


@pytest.mark.parametrize("name, offset, half, field", [
    ("blk.2.ffn_down.weight", 0, INF16, "scale"),
    ("blk.2.ffn_down.weight", 2, NAN16, "min"),
    ("token_embd.weight", 0, NAN16, "scale"),
], ids=["q4_1-infinite-scale", "q4_1-nan-min", "q8_0-nan-scale"])
def test_a_non_finite_block_scale_is_refused_naming_the_tensor_and_block(device, tiny_llama_path, tmp_path, name,
                                                                         offset, half, field):
    path = with_half(tiny_llama_path, tmp_path / "bad.gguf", name, 17, offset, half)
    with pytest.raises(FormatError, match=rf"tensors\['{name}'\]: expected a finite float16 {field} in every block, "
                                          r"got 'an infinity or NaN in block 17'"):
        load_model(path, device)


# ----- the check itself, on bytes (the path the browser runs) -----------------------------------------------


def q4_1_blocks(count: int, scale: bytes = MAX16, low: bytes = MAX16) -> bytearray:
    return bytearray((scale + low + bytes(range(16))) * count)


def test_finite_extremes_pass() -> None:
    check_finite("q", Q4_1, q4_1_blocks(8))
    check_finite("q", Q8_0, (MAX16 + bytes(range(32))) * 8)
    check_finite("f", F32, struct.pack("<3f", 3.4028234663852886e38, -3.4028234663852886e38, 1.4e-45))


@pytest.mark.parametrize("block", [0, 5, 9])
def test_the_first_non_finite_block_is_named(block: int) -> None:
    data = q4_1_blocks(10)
    data[20 * block + 2:20 * block + 4] = b"\x00\xfc"  # -inf
    with pytest.raises(FormatError, match=f"expected a finite float16 min in every block, got 'an infinity or NaN "
                                          f"in block {block}'"):
        check_finite("q", Q4_1, data)


def test_an_infinite_f32_value_is_named() -> None:
    with pytest.raises(FormatError, match="got 'inf at element 2'"):
        check_finite("f", F32, struct.pack("<3f", 1.0, -2.0, float("inf")))


FIELDS = [pytest.param(t, field, high, id=f"{DEVICE_FORMS[t].name}-{field}")
          for t, fields in sorted(F16_HIGH_BYTES.items()) for field, high in fields.items()]


@pytest.mark.parametrize("ggml_type, field, high", FIELDS)
def test_a_non_finite_float16_field_of_any_type_is_refused_naming_its_block(ggml_type, field, high) -> None:
    size = 2 if ggml_type == F16 else DEVICE_FORMS[ggml_type].gguf_bytes
    data = bytearray(10 * size)
    data[5 * size + high - 1:5 * size + high + 1] = NAN16
    with pytest.raises(FormatError, match=f"expected a finite float16 {field} in every block, got 'an infinity or "
                                          f"NaN in block 5'"):
        check_finite("q", ggml_type, data)


@pytest.mark.parametrize("value, finite", [(b"\x80\x7f", False), (b"\xc1\xff", False), (b"\x7f\x7f", True),
                                           (b"\x7f\xff", True)], ids=["inf", "nan", "max", "lowest"])
def test_a_bf16_infinity_or_nan_is_refused_and_its_largest_values_pass(value: bytes, finite: bool) -> None:
    data = b"\x80\x3f" * 3 + value + b"\x00\x80" * 2  # 1.0, then the value at element 3, then -0.0
    if finite:
        check_finite("b", BF16, data)
    else:
        with pytest.raises(FormatError, match="expected finite values, got 'an infinity or NaN at element 3'"):
            check_finite("b", BF16, data)


def test_a_matrix_of_another_type_is_refused_naming_it_its_type_and_the_supported_ones(device) -> None:
    with pytest.raises(TensorError, match=r"blk\.0\.ffn_up\.weight: ggml type: expected one of F32 \(0\), F16 \(1\), "
                                          r"Q4_0 \(2\), Q4_1 \(3\), Q5_0 \(6\), Q8_0 \(8\), Q4_K \(12\), Q5_K \(13\), "
                                          r"Q6_K \(14\), BF16 \(30\), got 7"):
        upload_tensor(device, "blk.0.ffn_up.weight", 7, (32, 4), bytes(4 * 24))
