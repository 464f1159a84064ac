"""What every tokenizer of a GGUF file shares: its vocabulary, its special tokens, limits, decoding and streaming.

A tokenizer kind (``tokenizer.ggml.model``: byte-level BPE in :mod:`.tokenizer`, SentencePiece in
:mod:`.spm_tokenizer`) subclasses :class:`BaseTokenizer` and encodes the plain text between special tokens;
:func:`.tokenizer_kinds.tokenizer_from_gguf` picks the kind a file names. Special tokens written in the text
are found as llama.cpp finds them: the longest first, each at its leftmost occurrences in what is left.
"""

from __future__ import annotations

import codecs
import re
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from ..errors import FieldError, FormatError

if TYPE_CHECKING:
    from .gguf import GGUFFile

__all__ = ["TOKEN_BYTE", "TOKEN_CONTROL", "TOKEN_NORMAL", "TOKEN_UNKNOWN", "TOKEN_UNUSED", "TOKEN_USER_DEFINED",
           "BaseTokenizer", "StreamDecoder", "gguf_options", "utf8"]

TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED, TOKEN_BYTE = 1, 2, 3, 4, 5, 6
"""``tokenizer.ggml.token_type`` values (llama.cpp's llama_token_type)."""

_Matcher = tuple[re.Pattern[str], frozenset[str], dict[str, int]]
"""Tokens found in the text: a regex of their first characters, every prefix of them, and their ids by text."""

_SPECIAL_TYPES = (TOKEN_UNKNOWN, TOKEN_CONTROL)  # left out of decoded text on request, as llama.cpp does
_ALWAYS_MATCHED = (TOKEN_USER_DEFINED,)  # found in the text even where special tokens are not parsed
_CACHE_LIMIT = 65536  # words whose ids are kept; the cache is emptied when it holds more


def utf8(field: str, text: str) -> bytes:
    """``text`` in UTF-8; FieldError naming ``field`` if it is not a str or holds a lone surrogate (not Unicode
    text: what bytes that are not UTF-8 become in a command line's arguments)."""
    if not isinstance(text, str):
        raise FieldError(field, "a str", type(text).__name__)
    try:
        return text.encode()
    except UnicodeEncodeError as exc:
        raise FieldError(field, "Unicode text (valid UTF-8)", f"U+{ord(text[exc.start]):04X} at character "
                         f"{exc.start}", "a lone surrogate: bytes that are not UTF-8") from None


def gguf_options(f: GGUFFile, *, add_bos: bool) -> dict[str, Any]:
    """The special ids of GGUF file ``f`` and whether it adds BOS (``add_bos`` where the file does not say), as
    keyword arguments of :class:`BaseTokenizer`."""

    def optional_id(key: str) -> int | None:
        return f.field(key, int) if key in f.metadata else None

    return {"bos_id": f.field("tokenizer.ggml.bos_token_id", int),
            "eos_id": f.field("tokenizer.ggml.eos_token_id", int),
            "unk_id": optional_id("tokenizer.ggml.unknown_token_id"),
            "pad_id": optional_id("tokenizer.ggml.padding_token_id"),
            "add_bos": f.field("tokenizer.ggml.add_bos_token", bool)
            if "tokenizer.ggml.add_bos_token" in f.metadata else add_bos}


class BaseTokenizer(ABC):
    """A GGUF tokenizer: ``encode`` text to token ids, ``decode`` ids to text.

    ``tokens`` are the vocabulary as the file spells it, ``token_types`` one ``TOKEN_*`` value per token.
    Tokens of the control and unknown types are special (``special_ids``): found in the text only where special
    tokens are parsed, and left out of decoded text on request; user-defined tokens are found in the text
    always. ``token_bytes[i]`` is the text token ``i`` stands for.
    """

    def __init__(self, tokens: Sequence[str], token_types: Sequence[int], token_bytes: Sequence[bytes], *,
                 bos_id: int, eos_id: int, unk_id: int | None = None, pad_id: int | None = None,
                 add_bos: bool = False) -> None:
        if len(token_types) != len(tokens):
            raise FormatError("tokenizer.ggml.token_type", f"{len(tokens)} entries (one per token)", len(token_types))
        self.vocab_size = len(tokens)
        self._vocab: dict[str, int] = {}
        for i, token in enumerate(tokens):
            if self._vocab.setdefault(token, i) != i:
                raise FormatError(f"tokenizer.ggml.tokens[{i}]", "a token not listed before", token)
        for name, value in (("bos_token_id", bos_id), ("eos_token_id", eos_id), ("unknown_token_id", unk_id),
                            ("padding_token_id", pad_id)):
            if value is not None and not 0 <= value < self.vocab_size:
                raise FormatError(f"tokenizer.ggml.{name}", f"a token id in [0, {self.vocab_size})", value)
        self.bos_id, self.eos_id, self.unk_id, self.pad_id, self.add_bos = bos_id, eos_id, unk_id, pad_id, add_bos
        self.special_ids = frozenset(i for i, t in enumerate(token_types) if t in _SPECIAL_TYPES)
        always = [i for i, t in enumerate(token_types) if t in _ALWAYS_MATCHED and tokens[i]]
        # parse_special -> the tokens found in the text
        self._matched = {parse: self._matcher(tokens, sorted(always + [i for i in self.special_ids if tokens[i]]
                                                             if parse else always))
                         for parse in (False, True)}
        self._token_bytes = list(token_bytes)
        self._cache: dict[str, tuple[int, ...]] = {}
        self.longest_token_bytes = max(1, max(map(len, self._token_bytes), default=0))
        """The most bytes of text one token stands for: a text of n bytes is at least n / this many tokens."""

    @staticmethod
    def _matcher(tokens: Sequence[str], ids: list[int]) -> _Matcher | None:
        if not ids:
            return None
        texts = {tokens[i]: i for i in ids}
        prefixes = frozenset(t[:k] for t in texts for k in range(1, len(t) + 1))
        starts = re.compile("[" + "".join(map(re.escape, sorted({t[0] for t in texts}))) + "]")
        return starts, prefixes, texts

    def _fragments(self, text: str, parse_special: bool) -> list[str | int]:
        """``text`` split at the special tokens written in it (their ids), as llama.cpp's partition does: each
        token, the longest first, takes its leftmost occurrences in the spans of text no token took yet."""
        matcher = self._matched[parse_special]
        if matcher is None or not text:
            return [text] if text else []
        starts, prefixes, texts = matcher
        present = set()
        for m in starts.finditer(text):  # where a token may start: walk on while the text is a token's prefix
            p = m.start()
            for end in range(p + 1, len(text) + 1):
                piece = text[p:end]
                if piece not in prefixes:
                    break
                if piece in texts:
                    present.add(piece)
        fragments: list[str | int] = [text]
        for token in sorted(present, key=lambda t: (-len(t.encode()), texts[t])):  # by bytes, as llama.cpp
            split: list[str | int] = []
            for fragment in fragments:
                if isinstance(fragment, int) or token not in fragment:
                    split.append(fragment)
                    continue
                for k, span in enumerate(fragment.split(token)):
                    if k:
                        split.append(texts[token])
                    if span:
                        split.append(span)
            fragments = split
        return fragments

    @abstractmethod
    def _words(self, text: str, after_special: bool) -> Iterable[str]:
        """Plain ``text`` (no special token in it) cut where no token can span the cut, each part encoded alone;
        ``after_special``: the text starts the input or follows a special token."""

    @abstractmethod
    def _encode_word(self, word: str) -> tuple[int, ...]:
        """The ids of one of :meth:`_words`' parts."""

    def _encode_text(self, text: str, after_special: bool, out: list[int], limit: tuple[int, str] | None) -> None:
        """Append the ids of plain ``text`` to ``out``, a word at a time (each word's ids kept in a cache);
        refuses as soon as ``out`` holds more than ``limit`` allows."""
        cache = self._cache
        for word in self._words(text, after_special):
            word_ids = cache.get(word)
            if word_ids is None:
                word_ids = self._encode_word(word)
                if len(cache) >= _CACHE_LIMIT:
                    cache.clear()
                cache[word] = word_ids
            out.extend(word_ids)
            if limit is not None:
                self._check_limit(out, limit)

    def _min_text_bytes(self, raw: bytes) -> int:
        """How many bytes of ``raw`` need tokens at the least (all of them, unless a kind drops some)."""
        return len(raw)

    def encode(self, text: str, *, parse_special: bool = True, add_bos: bool | None = None,
               max_tokens: int | None = None) -> list[int]:
        """Token ids of ``text``; special tokens written in the text become their ids when ``parse_special``.

        ``add_bos`` (default: the model's ``add_bos_token``) puts the BOS token first. With ``max_tokens``, a
        text of more tokens is refused (FieldError naming the limit): at once where its size alone proves it
        (at least ``bytes / longest_token_bytes`` tokens), else once the tokens produced exceed the limit.
        """
        return self.encode_pieces([(text, parse_special)], add_bos=add_bos, max_tokens=max_tokens)

    def encode_pieces(self, pieces: Iterable[tuple[str, bool]], *, add_bos: bool | None = None,
                      max_tokens: int | None = None, field: str = "text") -> list[int]:
        """Token ids of the texts ``pieces`` one after the other, each a ``(text, parse_special)`` pair: special
        tokens written in a text become their ids only where its ``parse_special`` is true (a chat template's
        markers), elsewhere they are plain text. ``add_bos`` and ``max_tokens`` as :meth:`encode`; errors name
        ``field``."""
        pieces = list(pieces)
        raw = [utf8(field, text) for text, _ in pieces]
        bos = [self.bos_id] if (self.add_bos if add_bos is None else add_bos) else []
        limit = None
        if max_tokens is not None:
            if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 0:
                raise FieldError("max_tokens", "an integer >= 0", max_tokens)
            size = sum(map(self._min_text_bytes, raw))
            fewest = len(bos) + -(-size // self.longest_token_bytes)
            if fewest > max_tokens:
                raise FieldError(field, f"at most {max_tokens} tokens", f"{size} bytes of text, at least {fewest} "
                                 f"tokens (a token stands for at most {self.longest_token_bytes} bytes)")
            limit = (max_tokens, field)
        ids = bos
        after_special = True
        for text, parse_special in pieces:
            for fragment in self._fragments(text, parse_special):
                if isinstance(fragment, int):
                    ids.append(fragment)
                else:
                    self._encode_text(fragment, after_special, ids, limit)
                after_special = isinstance(fragment, int)
        if limit is not None:
            self._check_limit(ids, limit)
        return ids

    @staticmethod
    def _check_limit(ids: list[int], limit: tuple[int, str]) -> None:
        if len(ids) > limit[0]:
            raise FieldError(limit[1], f"at most {limit[0]} tokens", f"more than {limit[0]} tokens")

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes token ``token_id`` stands for (a special token: its text in UTF-8)."""
        if isinstance(token_id, bool) or not isinstance(token_id, int) or not 0 <= token_id < self.vocab_size:
            raise FieldError("token_id", f"a token id in [0, {self.vocab_size})", token_id)
        return self._token_bytes[token_id]

    def decode(self, ids: Iterable[int], *, skip_special: bool = False) -> str:
        """The text of token ids ``ids``; bytes that are not valid UTF-8 become U+FFFD."""
        return b"".join(self._pieces(ids, skip_special)).decode("utf-8", "replace")

    def _pieces(self, ids: Iterable[int], skip_special: bool) -> Iterator[bytes]:
        for token_id in ids:
            piece = self.token_bytes(token_id)
            if not (skip_special and token_id in self.special_ids):
                yield piece

    def stream_decoder(self, *, skip_special: bool = False) -> StreamDecoder:
        """A decoder fed one token at a time that returns text only once its UTF-8 characters are complete."""
        return StreamDecoder(self, skip_special=skip_special)


class StreamDecoder:
    """Decodes tokens one at a time: ``push`` returns the newly completed text, ``flush`` what is left.

    Concatenating every ``push`` and the final ``flush`` gives ``decode`` of the same tokens.
    """

    def __init__(self, tokenizer: BaseTokenizer, *, skip_special: bool = False) -> None:
        self._tokenizer = tokenizer
        self._skip_special = skip_special
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")

    def push(self, token_id: int) -> str:
        """Text completed by token ``token_id`` (empty while a character's bytes are still incomplete)."""
        piece = self._tokenizer.token_bytes(token_id)
        if self._skip_special and token_id in self._tokenizer.special_ids:
            return ""
        return self._decoder.decode(piece)

    def flush(self) -> str:
        """The text of bytes still held (U+FFFD for an incomplete character) and a reset for reuse."""
        text = self._decoder.decode(b"", final=True)
        self._decoder.reset()
        return text
