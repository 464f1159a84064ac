"""The GGUF's SentencePiece tokenizer ("llama"): on the real Gemma 3 vocabulary against HF ``tokenizers`` built
from the same tokens, scores and types, and on tiny vocabularies for each rule of llama.cpp's llm_tokenizer_spm."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import AddedToken, decoders, models, normalizers
from tokenizers import Tokenizer as HFTokenizer

from kvckpt_web.errors import FieldError, FormatError
from kvckpt_web.model.gguf import GGUFFile, open_gguf
from kvckpt_web.model.spm_tokenizer import SentencePieceTokenizer
from kvckpt_web.model.tokenizer import Tokenizer
from kvckpt_web.model.tokenizer_base import (TOKEN_BYTE, TOKEN_CONTROL, TOKEN_NORMAL, TOKEN_UNKNOWN,
                                             TOKEN_USER_DEFINED)
from kvckpt_web.model.tokenizer_kinds import tokenizer_from_gguf

from tokenizer_texts import TEXTS

GEMMA_TEXTS = [
    *TEXTS,
    "<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n",
    "<bos><eos><pad><unk><mask><start_of_turn><end_of_turn>",
    "not special: <start_of_tur> <bos <end_of_turn >",
    "<table><tr><td>1</td></tr></table> <h1>Title</h1> <b>bold</b> <s>strike</s> <code>x</code>",
    "a" + " " * 40 + "b" + "\n" * 35 + "c" + "\t" * 33 + "d",
    "byte fallback: \x00\x01\x7f \U0001fae8 \U000e0041 \ufffe",
    "literal <0x41> and [multimodal]",
]


@pytest.fixture(scope="module")
def gemma(gemma_path) -> GGUFFile:
    return open_gguf(gemma_path)


@pytest.fixture(scope="module")
def tokenizer(gemma: GGUFFile) -> SentencePieceTokenizer:
    made = tokenizer_from_gguf(gemma)
    assert isinstance(made, SentencePieceTokenizer)
    return made


def hf_reference(tokens: list[str], scores: list[float], types: list[int]) -> HFTokenizer:
    """HF tokenizers set up as a SentencePiece BPE model: spaces written "▁", byte fallback, the merges every
    split of a token into two tokens gives, ranked by the joined token's score (as HF's SentencePiece converter
    ranks them), the control, unknown and user-defined tokens matched verbatim in the text."""
    vocab = {t: i for i, t in enumerate(tokens)}
    merges = sorted((-scores[i], i, vocab[t[:k]], vocab[t[k:]])
                    for t, i in vocab.items() for k in range(1, len(t)) if t[:k] in vocab and t[k:] in vocab)
    ref = HFTokenizer(models.BPE(vocab, [(tokens[a], tokens[b]) for *_, a, b in merges], byte_fallback=True))
    ref.normalizer = normalizers.Replace(" ", "\u2581")
    ref.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
    ref.add_tokens([AddedToken(tokens[i], special=kind != TOKEN_USER_DEFINED, normalized=False)
                    for i, kind in enumerate(types) if kind in (TOKEN_CONTROL, TOKEN_UNKNOWN, TOKEN_USER_DEFINED)])
    return ref


@pytest.fixture(scope="module")
def hf(gemma: GGUFFile) -> HFTokenizer:
    m = gemma.metadata
    return hf_reference(m["tokenizer.ggml.tokens"], m["tokenizer.ggml.scores"], m["tokenizer.ggml.token_type"])


# ---------------------------------------------------------------- the real Gemma 3 vocabulary

@pytest.mark.parametrize("text", GEMMA_TEXTS)
def test_gemma_encode_equals_hf(tokenizer: SentencePieceTokenizer, hf: HFTokenizer, text: str) -> None:
    assert tokenizer.encode(text, add_bos=False) == hf.encode(text, add_special_tokens=False).ids


@pytest.mark.parametrize("text", GEMMA_TEXTS)
def test_gemma_decode_of_encode_is_the_text(tokenizer: SentencePieceTokenizer, hf: HFTokenizer, text: str) -> None:
    ids = tokenizer.encode(text, add_bos=False)
    assert tokenizer.decode(ids) == hf.decode(ids, skip_special_tokens=False) == text


@settings(max_examples=400, deadline=None)
@given(st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\u2581"), max_size=40))
def test_gemma_encode_equals_hf_on_random_text(tokenizer: SentencePieceTokenizer, hf: HFTokenizer,
                                               text: str) -> None:
    ids = tokenizer.encode(text, add_bos=False)
    assert ids == hf.encode(text, add_special_tokens=False).ids
    assert tokenizer.decode(ids) == text


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from([" ", "  ", "\n", "\t", "\u2581", "<", ">", "/", "b", "s", "0x", "A",
                                         "e", "é", "日", "😀", "\x00", "<bos>", "<end_of_turn>", "<td>", "."]),
               max_size=30).map("".join))
def test_gemma_encode_equals_hf_on_dense_edge_cases(tokenizer: SentencePieceTokenizer, hf: HFTokenizer,
                                                    text: str) -> None:
    assert tokenizer.encode(text, add_bos=False) == hf.encode(text, add_special_tokens=False).ids


def test_gemma_a_written_sentencepiece_space_decodes_as_a_space(tokenizer: SentencePieceTokenizer,
                                                                hf: HFTokenizer) -> None:
    ids = tokenizer.encode("a \u2581 b", add_bos=False)  # "▁" is how the vocabulary writes a space
    assert ids == hf.encode("a \u2581 b", add_special_tokens=False).ids
    assert tokenizer.decode(ids) == "a   b"


def test_gemma_flags_are_the_files(tokenizer: SentencePieceTokenizer) -> None:
    assert (tokenizer.bos_id, tokenizer.eos_id, tokenizer.unk_id, tokenizer.pad_id) == (2, 1, 3, 0)
    assert tokenizer.add_bos is True and tokenizer.add_space_prefix is False
    assert tokenizer.vocab_size == 262144


def test_gemma_known_ids_are_llama_cpps(tokenizer: SentencePieceTokenizer) -> None:
    # llama.cpp's ids (bench/notes/2026-12-07-tokenizer-vs-llama-cpp.md)
    assert tokenizer.encode("Paris is the capital of") == [2, 50429, 563, 506, 5279, 529]


def test_gemma_puts_bos_first_by_default(tokenizer: SentencePieceTokenizer) -> None:
    assert tokenizer.encode("Paris is the capital of") == [2] + tokenizer.encode("Paris is the capital of",
                                                                                  add_bos=False)


def test_gemma_turn_markers_are_special_and_newlines_are_not(tokenizer: SentencePieceTokenizer) -> None:
    assert tokenizer.encode("<start_of_turn><end_of_turn>\n", add_bos=False) == [105, 106, 107]
    assert {105, 106, 0, 1, 2, 3} <= tokenizer.special_ids and 107 not in tokenizer.special_ids


def test_gemma_user_defined_tokens_are_found_even_when_special_tokens_are_not(
        tokenizer: SentencePieceTokenizer) -> None:
    ids = tokenizer.encode("<end_of_turn>\n\n<td>", parse_special=False, add_bos=False)
    assert 106 not in ids and ids[-2:] == [108, 175]  # "\n\n" and "<td>" are user-defined: found as llama.cpp does


def test_gemma_decode_skip_special_keeps_newlines(tokenizer: SentencePieceTokenizer) -> None:
    ids = tokenizer.encode("<start_of_turn>model\nHi\n\nthere<end_of_turn>")
    assert tokenizer.decode(ids, skip_special=True) == "model\nHi\n\nthere"


def test_gemma_stream_decoder_concatenation_is_decode(tokenizer: SentencePieceTokenizer) -> None:
    ids = tokenizer.encode("streaming: 日本語 😀 \U0001fae8 café", add_bos=False)
    stream = tokenizer.stream_decoder()
    pieces = [stream.push(i) for i in ids]
    assert "".join(pieces) + stream.flush() == tokenizer.decode(ids)
    assert all("\ufffd" not in p for p in pieces)


def test_gemma_prompt_limit_is_enforced(tokenizer: SentencePieceTokenizer) -> None:
    with pytest.raises(FieldError, match="text: expected at most 3 tokens"):
        tokenizer.encode("Paris is the capital of France", max_tokens=3)


# ---------------------------------------------------------------- the rules, on tiny vocabularies

def tiny(tokens: dict[str, float], *, types: dict[str, int] | None = None, bytes_: bool = True,
         **options: object) -> SentencePieceTokenizer:
    """A SentencePiece tokenizer of ``tokens`` (text -> score) after <unk>, <s>, </s> and, with ``bytes_``, the
    256 byte tokens; ``types`` gives tokens another type than normal."""
    vocab = {"<unk>": 0.0, "<s>": 0.0, "</s>": 0.0, **({f"<0x{b:02X}>": 0.0 for b in range(256)} if bytes_ else {}),
             **tokens}
    kinds = {"<unk>": TOKEN_UNKNOWN, "<s>": TOKEN_CONTROL, "</s>": TOKEN_CONTROL,
             **({f"<0x{b:02X}>": TOKEN_BYTE for b in range(256)} if bytes_ else {}), **(types or {})}
    args: dict = {"bos_id": 1, "eos_id": 2, "unk_id": 0, "add_bos": False, "add_space_prefix": False, **options}
    return SentencePieceTokenizer(list(vocab), list(vocab.values()), [kinds.get(t, TOKEN_NORMAL) for t in vocab],
                                  **args)


def pieces(tok: SentencePieceTokenizer, text: str, **options: object) -> list[str]:
    return [tok.token_bytes(i).decode("latin-1") if i >= 259 or i < 3 else f"<{i - 3:02X}>"
            for i in tok.encode(text, **options)]


def test_the_pair_of_the_highest_score_merges_first() -> None:
    tok = tiny({"a": -1, "b": -1, "c": -1, "ab": -5, "bc": -2})
    assert pieces(tok, "abc") == ["a", "bc"]


def test_the_leftmost_pair_merges_first_among_equal_scores() -> None:
    tok = tiny({"a": -1, "b": -1, "ab": -2, "ba": -2})
    assert pieces(tok, "aba") == ["ab", "a"]


def test_merging_goes_on_through_merged_symbols() -> None:
    tok = tiny({"a": -1, "b": -1, "c": -1, "ab": -2, "abc": -3, "bc": -4})
    assert pieces(tok, "abcab") == ["abc", "ab"]


def test_a_token_joining_across_a_space_still_forms() -> None:
    tok = tiny({"a": -1, ">": -1, "<": -1, "\u2581": -1, "\u2581a": -2, ">\u2581": -4, ">\u2581<": -3})
    assert pieces(tok, "a> <a a") == ["a", "> <", "a", " a"]  # merging is cut before a space, but not after ">"


def test_encoding_stops_once_the_tokens_exceed_the_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    tok = tiny({"a": -1, "\u2581": -1, "\u2581a": -2, "a" * 20: -3})  # 20 bytes a token: the size cannot tell
    encoded = []
    merge = tok._encode_word
    monkeypatch.setattr(tok, "_encode_word", lambda word: encoded.append(word) or merge(word))
    words = [f"a{chr(0x100 + i)}" for i in range(1000)]  # 3 tokens each: "▁a" and the 2 bytes of a character
    with pytest.raises(FieldError, match="text: expected at most 300 tokens, got 'more than 300 tokens'"):
        tok.encode(" ".join(words), max_tokens=300)
    assert len(encoded) <= 101  # a word at a time: the rest of the text is never merged


def test_spaces_are_written_as_the_sentencepiece_space() -> None:
    tok = tiny({"a": -1, "\u2581": -1, "\u2581a": -2})
    assert pieces(tok, "a a") == ["a", " a"]


def test_add_space_prefix_puts_a_space_first_and_after_each_special_token() -> None:
    tok = tiny({"a": -1, "\u2581": -1, "\u2581a": -2}, add_space_prefix=True)
    assert pieces(tok, "a</s>a") == [" a", "</s>", " a"]


def test_a_character_without_a_token_becomes_its_utf8_bytes() -> None:
    tok = tiny({"a": -1})
    assert pieces(tok, "aé") == ["a", "<C3>", "<A9>"]
    assert tok.decode(tok.encode("aé")) == "aé"


def test_without_byte_tokens_an_unknown_character_is_the_unknown_token() -> None:
    tok = tiny({"a": -1}, bytes_=False)
    assert tok.encode("aé") == [3, 0, 0]  # one per byte of "é"


def test_without_byte_tokens_or_an_unknown_token_the_vocabulary_is_refused() -> None:
    with pytest.raises(FormatError, match="tokenizer.ggml.tokens: expected a byte token <0xNN> for every byte"):
        tiny({"a": -1}, bytes_=False, unk_id=None)


def test_special_tokens_are_found_longest_first_as_llama_cpp_does() -> None:
    user = {"ab": TOKEN_USER_DEFINED, "bcd": TOKEN_USER_DEFINED}
    tok = tiny({"a": -1, "b": -1, "c": -1, "d": -1, "ab": -1, "bcd": -1}, types=user)
    assert pieces(tok, "abcd") == ["a", "bcd"]  # leftmost-longest would give "ab", "c", "d"


def test_control_tokens_are_plain_text_when_special_tokens_are_not_parsed() -> None:
    tok = tiny({"<": -1, "/": -1, "s": -1, ">": -1})
    assert pieces(tok, "</s>") == ["</s>"]
    assert pieces(tok, "</s>", parse_special=False) == ["<", "/", "s", ">"]


def test_decode_skip_special_drops_control_tokens_only() -> None:
    tok = tiny({"a": -1, "<x>": -1}, types={"<x>": TOKEN_USER_DEFINED})
    assert tok.decode(tok.encode("<s>a<x></s>"), skip_special=True) == "a<x>"


def test_refuses_scores_of_another_length() -> None:
    with pytest.raises(FormatError, match="tokenizer.ggml.scores"):
        SentencePieceTokenizer(["a", "b"], [0.0], [TOKEN_NORMAL] * 2, bos_id=0, eos_id=0, unk_id=0)


def test_refuses_a_score_that_is_not_finite() -> None:
    with pytest.raises(FormatError, match=r"tokenizer.ggml.scores\[259\]: expected a finite number"):
        tiny({"a": float("nan")})


def test_refuses_a_byte_token_not_written_0xNN() -> None:
    with pytest.raises(FormatError, match="<0xNN>"):
        tiny({"<0xZZ>": 0.0}, types={"<0xZZ>": TOKEN_BYTE})


# ---------------------------------------------------------------- the kind a file names

def with_metadata(f: GGUFFile, **changes: object) -> GGUFFile:
    return dataclasses.replace(f, metadata={**f.metadata, **{k.replace("__", "."): v for k, v in changes.items()}})


def test_a_gpt2_file_gets_the_byte_level_bpe_tokenizer(smollm: GGUFFile) -> None:
    assert type(tokenizer_from_gguf(smollm)) is Tokenizer


def test_another_tokenizer_model_is_refused_naming_both_kinds(smollm: GGUFFile) -> None:
    with pytest.raises(FormatError, match="tokenizer.ggml.model: expected 'gpt2' .* or 'llama' .*got 'bert'"):
        tokenizer_from_gguf(with_metadata(smollm, tokenizer__ggml__model="bert"))


def test_a_file_that_does_not_say_adds_bos_and_a_space_prefix(gemma: GGUFFile) -> None:
    f = dataclasses.replace(gemma, metadata={k: v for k, v in gemma.metadata.items()
                                             if k not in ("tokenizer.ggml.add_bos_token",
                                                          "tokenizer.ggml.add_space_prefix")})
    tok = tokenizer_from_gguf(f)
    assert tok.add_bos is True and tok.add_space_prefix is True
