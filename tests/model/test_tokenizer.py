"""The GGUF's byte-level BPE tokenizer against HF ``tokenizers`` built from the same vocabulary and merges."""

from __future__ import annotations

import dataclasses
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import AddedToken, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

from kvckpt_web.errors import FieldError, FormatError
from kvckpt_web.model.gguf import GGUFFile
from kvckpt_web.model.tokenizer import Tokenizer, pre_tokenize
from kvckpt_web.model.tokenizer_base import TOKEN_CONTROL, TOKEN_NORMAL

from tokenizer_texts import TEXTS

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<repo_name>", "<reponame>", "<file_sep>", "<filename>",
            "<gh_stars>", "<issue_start>", "<issue_comment>", "<issue_closed>", "<jupyter_start>", "<jupyter_text>",
            "<jupyter_code>", "<jupyter_output>", "<jupyter_script>", "<empty_output>"]

CORPUS = [
    *TEXTS,
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "".join(SPECIALS),
    "<reponame>x<repo_name>y<|im_start|><|im_start|> <|im_end|>\n",
    "not special: <|im_star|> <im_start> < |im_end| >",
]


@pytest.fixture(scope="module")
def tokenizer(smollm: GGUFFile) -> Tokenizer:
    return Tokenizer.from_gguf(smollm)


@pytest.fixture(scope="module")
def hf(smollm: GGUFFile, tokenizer: Tokenizer) -> HFTokenizer:
    """HF tokenizers set up as SmolLM2's tokenizer.json, from the GGUF's own vocabulary and merges."""
    tokens = smollm.metadata["tokenizer.ggml.tokens"]
    merges = [tuple(m.split(" ")) for m in smollm.metadata["tokenizer.ggml.merges"]]
    ref = HFTokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, merges))
    ref.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    ref.decoder = decoders.ByteLevel()
    ref.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False)
                            for i in sorted(tokenizer.special_ids)])
    return ref


@pytest.fixture(scope="module")
def byte_ids(tokenizer: Tokenizer) -> dict[bytes, int]:
    """Token id of every single byte that has a token of its own."""
    ids = {}
    for i in range(tokenizer.vocab_size):
        b = tokenizer.token_bytes(i)
        if len(b) == 1 and i not in tokenizer.special_ids:
            ids[b] = i
    return ids


@pytest.mark.parametrize("text", CORPUS)
def test_encode_equals_hf(tokenizer: Tokenizer, hf: HFTokenizer, text: str) -> None:
    assert tokenizer.encode(text) == hf.encode(text).ids


@pytest.mark.parametrize("text", CORPUS)
def test_decode_equals_hf(tokenizer: Tokenizer, hf: HFTokenizer, text: str) -> None:
    ids = hf.encode(text).ids
    assert tokenizer.decode(ids) == hf.decode(ids, skip_special_tokens=False)


@pytest.mark.parametrize("text", [t for t in CORPUS if "\x04" not in t])
def test_decode_of_encode_is_the_text(tokenizer: Tokenizer, text: str) -> None:
    assert tokenizer.decode(tokenizer.encode(text)) == text


def test_special_tokens_are_their_ids(tokenizer: Tokenizer) -> None:
    assert tokenizer.encode("".join(SPECIALS)) == list(range(17))
    assert sorted(tokenizer.special_ids) == list(range(17))


def test_special_tokens_as_plain_text_when_not_parsed(tokenizer: Tokenizer) -> None:
    ids = tokenizer.encode("<|im_start|>user", parse_special=False)
    assert 1 not in ids
    assert tokenizer.decode(ids) == "<|im_start|>user"


def test_known_ids(tokenizer: Tokenizer) -> None:
    assert (tokenizer.bos_id, tokenizer.eos_id, tokenizer.unk_id, tokenizer.pad_id) == (1, 2, 0, 2)
    assert tokenizer.add_bos is False and tokenizer.vocab_size == 49152
    assert tokenizer.encode("Hello world!") == [19556, 905, 17]


def test_add_bos_puts_bos_first(tokenizer: Tokenizer) -> None:
    assert tokenizer.encode("Hello", add_bos=True) == [1] + tokenizer.encode("Hello")


def test_bytes_without_a_token_are_dropped_like_hf(tokenizer: Tokenizer, hf: HFTokenizer) -> None:
    assert tokenizer.encode("a\x04b") == hf.encode("a\x04b").ids == tokenizer.encode("a") + tokenizer.encode("b")


def test_every_digit_is_a_word() -> None:
    assert pre_tokenize("abc123 4x") == ["abc", "1", "2", "3", " ", "4", "x"]


def test_pre_tokenize_gpt2_pattern() -> None:
    assert pre_tokenize("I'm  here!\n\n  ok") == ["I", "'m", " ", " here", "!", "\n\n ", " ok"]


def test_decode_invalid_utf8_equals_hf(tokenizer: Tokenizer, hf: HFTokenizer, byte_ids: dict[bytes, int]) -> None:
    for raw in (b"\xe6", b"a\xe6b", b"\xe6\x97", b"\xf0\x9f\x98", b"\x80\x80", b"\xc3\x28", b"\xed\xa0\x80",
                b"\xef\xbf\xbd", b"\xe0\x80\xaf", b"\xf4\x90\x80\x80"):
        ids = [byte_ids[bytes([b])] for b in raw]
        assert tokenizer.decode(ids) == hf.decode(ids, skip_special_tokens=False), raw


def test_decode_skip_special_drops_special_tokens(tokenizer: Tokenizer, hf: HFTokenizer) -> None:
    ids = tokenizer.encode("<|im_start|>user\nhi<|im_end|>")
    assert tokenizer.decode(ids, skip_special=True) == hf.decode(ids, skip_special_tokens=True) == "user\nhi"


def test_decode_refuses_unknown_ids(tokenizer: Tokenizer) -> None:
    with pytest.raises(FieldError, match="token_id"):
        tokenizer.decode([5, 49152])


def test_stream_decoder_concatenation_is_decode(tokenizer: Tokenizer) -> None:
    text = "streaming: 日本語 😀👨‍👩‍👧 café <|im_end|>"
    ids = tokenizer.encode(text)
    stream = tokenizer.stream_decoder()
    pieces = [stream.push(i) for i in ids]
    assert "".join(pieces) + stream.flush() == tokenizer.decode(ids) == text
    assert all("\ufffd" not in p for p in pieces)


def test_stream_decoder_holds_back_an_incomplete_character(tokenizer: Tokenizer,
                                                            byte_ids: dict[bytes, int]) -> None:
    stream = tokenizer.stream_decoder()
    emoji = "😀".encode()
    assert [stream.push(byte_ids[emoji[i:i + 1]]) for i in range(4)] == ["", "", "", "😀"]


def test_stream_decoder_flush_replaces_an_unfinished_character(tokenizer: Tokenizer,
                                                               byte_ids: dict[bytes, int]) -> None:
    stream = tokenizer.stream_decoder()
    assert stream.push(byte_ids[b"a"]) + stream.push(byte_ids[b"\xe6"]) == "a"
    assert stream.flush() == "\ufffd"
    assert stream.push(byte_ids[b"b"]) == "b"


def test_stream_decoder_skip_special(tokenizer: Tokenizer) -> None:
    stream = tokenizer.stream_decoder(skip_special=True)
    assert [stream.push(i) for i in tokenizer.encode("hi<|im_end|>")] == ["hi", ""]


def test_encode_refuses_non_text(tokenizer: Tokenizer) -> None:
    with pytest.raises(FieldError, match="text: expected a str, got 'bytes'"):
        tokenizer.encode(b"hi")  # type: ignore[arg-type]


@settings(max_examples=400, deadline=None)
@given(st.text(alphabet=st.characters(codec="utf-8"), max_size=40))
def test_encode_equals_hf_on_random_text(tokenizer: Tokenizer, hf: HFTokenizer, text: str) -> None:
    assert tokenizer.encode(text) == hf.encode(text).ids


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from(" \t\n\r\u00a0\u3000'sdtmrvel1Aé日😀!.<|>_") , max_size=30))
def test_encode_equals_hf_on_dense_edge_cases(tokenizer: Tokenizer, hf: HFTokenizer, text: str) -> None:
    assert tokenizer.encode(text) == hf.encode(text).ids


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=49151), max_size=12))
def test_decode_equals_hf_on_random_ids(tokenizer: Tokenizer, hf: HFTokenizer, ids: list[int]) -> None:
    assert tokenizer.decode(ids) == hf.decode(ids, skip_special_tokens=False)


def test_special_tokens_as_plain_text_equal_hf_with_special_tokens_off(tokenizer: Tokenizer, hf: HFTokenizer) -> None:
    text = "hi<|im_end|>\n<|im_start|>system\nobey<|endoftext|>"
    hf.encode_special_tokens = True
    try:
        assert tokenizer.encode(text, parse_special=False) == hf.encode(text).ids
    finally:
        hf.encode_special_tokens = False


def test_a_lone_surrogate_is_refused_naming_the_text(tokenizer: Tokenizer) -> None:
    with pytest.raises(FieldError, match=r"text: expected Unicode text.*got 'U\+DCFF at character 3'"):
        tokenizer.encode("hi \udcff there")  # what the bytes b"hi \xff there" of a command line become


# ---------------------------------------------------------------- the work is bounded

def random_word(length: int, seed: int = 0) -> str:
    rng = random.Random(seed)
    return "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(length))


class CountingRanks(dict):
    """The tokenizer's merge ranks, counting the pairs looked up."""

    lookups = 0

    def get(self, key, default=None):
        self.lookups += 1
        return super().get(key, default)


def test_merging_a_word_looks_up_a_few_pairs_per_byte_not_a_pass_per_merge(tokenizer: Tokenizer,
                                                                           monkeypatch) -> None:
    word = random_word(4000)
    ranks = CountingRanks(tokenizer._ranks)
    monkeypatch.setattr(tokenizer, "_ranks", ranks)
    merges = len(word) - len(tokenizer._encode_word(word))
    lookups = ranks.lookups
    assert merges > 1000
    assert lookups <= 6 * len(word)  # the first pairs, then per merge 2 new pairs, and one per candidate popped


def test_a_long_word_encodes_as_hf_does(tokenizer: Tokenizer, hf: HFTokenizer) -> None:
    word = random_word(3000, seed=1) + "éß日本😀" * 50
    assert tokenizer.encode(word) == hf.encode(word).ids


def test_a_text_too_large_for_the_limit_is_refused_before_any_encoding(tokenizer: Tokenizer, monkeypatch) -> None:
    monkeypatch.setattr(tokenizer, "_encode_word", lambda word: pytest.fail("encoded a word"))
    size = 10 * tokenizer.longest_token_bytes + 1  # 11 tokens at the very least
    with pytest.raises(FieldError, match=f"text: expected at most 10 tokens, got '{size} bytes of text, at least 11 "
                                         "tokens"):
        tokenizer.encode("x" * size, max_tokens=10)


def test_encoding_stops_once_the_tokens_exceed_the_limit(tokenizer: Tokenizer, monkeypatch) -> None:
    words = [random_word(8, seed=i) for i in range(2000)]  # few bytes per token: the size alone cannot tell
    encoded = []
    bpe = tokenizer._encode_word
    monkeypatch.setattr(tokenizer, "_encode_word", lambda word: encoded.append(word) or bpe(word))
    with pytest.raises(FieldError, match="text: expected at most 300 tokens, got 'more than 300 tokens'"):
        tokenizer.encode(" ".join(words), max_tokens=300)
    assert len(encoded) <= 301


def test_a_text_of_exactly_the_limit_encodes(tokenizer: Tokenizer) -> None:
    ids = tokenizer.encode("Hello world!")
    assert tokenizer.encode("Hello world!", max_tokens=len(ids)) == ids
    with pytest.raises(FieldError, match="at most 2 tokens"):
        tokenizer.encode("Hello world!", max_tokens=2)


# ---------------------------------------------------------------- refusing what is not implemented

def with_metadata(f: GGUFFile, **changes: object) -> GGUFFile:
    return dataclasses.replace(f, metadata={**f.metadata, **{k.replace("__", "."): v for k, v in changes.items()}})


def test_refuses_another_tokenizer_model(smollm: GGUFFile) -> None:
    with pytest.raises(FormatError, match="tokenizer.ggml.model: expected 'gpt2'.*got 'llama'"):
        Tokenizer.from_gguf(with_metadata(smollm, tokenizer__ggml__model="llama"))


def test_refuses_another_pre_tokenizer(smollm: GGUFFile) -> None:
    with pytest.raises(FormatError, match="tokenizer.ggml.pre: .*got 'llama-bpe'"):
        Tokenizer.from_gguf(with_metadata(smollm, tokenizer__ggml__pre="llama-bpe"))


def test_refuses_a_missing_vocabulary(smollm: GGUFFile) -> None:
    f = dataclasses.replace(smollm, metadata={k: v for k, v in smollm.metadata.items()
                                              if k != "tokenizer.ggml.merges"})
    with pytest.raises(FormatError, match="tokenizer.ggml.merges"):
        Tokenizer.from_gguf(f)


def tiny(**overrides: object) -> Tokenizer:
    args: dict = {"tokens": ["a", "b", "ab", "<s>"], "merges": ["a b"],
                  "token_types": [TOKEN_NORMAL] * 3 + [TOKEN_CONTROL], "bos_id": 3, "eos_id": 3}
    args.update(overrides)
    return Tokenizer(**args)


def test_tiny_vocabulary_merges() -> None:
    assert tiny().encode("ab<s>ba") == [2, 3, 1, 0]


def test_refuses_a_merge_of_unknown_tokens() -> None:
    with pytest.raises(FormatError, match=r"tokenizer.ggml.merges\[1\]"):
        tiny(merges=["a b", "b a"])


def test_refuses_a_malformed_merge() -> None:
    with pytest.raises(FormatError, match=r"tokenizer.ggml.merges\[0\]"):
        tiny(merges=["ab"])


def test_refuses_a_duplicate_token() -> None:
    with pytest.raises(FormatError, match=r"tokenizer.ggml.tokens\[2\]"):
        tiny(tokens=["a", "b", "a", "<s>"])


def test_refuses_token_types_of_another_length() -> None:
    with pytest.raises(FormatError, match="tokenizer.ggml.token_type"):
        tiny(token_types=[TOKEN_NORMAL] * 3)


def test_refuses_a_special_id_outside_the_vocabulary() -> None:
    with pytest.raises(FormatError, match="tokenizer.ggml.eos_token_id"):
        tiny(eos_id=4)
