"""The byte-level BPE tokenizer a GGUF file carries (``tokenizer.ggml.model`` "gpt2", pre-tokenizer "smollm").

Encoding splits the text on special tokens (``<|im_start|>`` ...), then pre-tokenizes each remaining span
as SmolLM2's tokenizer.json does (every digit alone, then GPT-2's word pattern), maps each word's UTF-8
bytes to GPT-2's printable byte alphabet and merges symbol pairs by rank, lowest first, leftmost among equals
(as HF tokenizers and llama.cpp do: a heap of candidate pairs over a linked list of symbols, O(n log n) in a
word's length). A limit on the tokens is enforced before any work where the text's size alone exceeds it,
else as soon as the tokens produced exceed it. Decoding maps tokens back to bytes; invalid UTF-8 becomes
U+FFFD, and :class:`StreamDecoder` holds back incomplete characters while streaming.
"""

from __future__ import annotations

import codecs
import heapq
import re
import unicodedata
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING

from ..errors import FieldError, FormatError

if TYPE_CHECKING:
    from .gguf import GGUFFile

__all__ = ["PRE_TOKENIZERS", "TOKEN_CONTROL", "TOKEN_NORMAL", "TOKEN_USER_DEFINED", "StreamDecoder", "Tokenizer",
           "pre_tokenize", "utf8"]

TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED, TOKEN_BYTE = 1, 2, 3, 4, 5, 6
"""``tokenizer.ggml.token_type`` values (llama.cpp's llama_token_type)."""

PRE_TOKENIZERS = ("smollm",)
"""``tokenizer.ggml.pre`` values whose pre-tokenizer is implemented here."""

_SPECIAL_TYPES = (TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER_DEFINED)  # matched verbatim in the text, as llama.cpp
_CACHE_LIMIT = 65536  # words whose BPE result is kept; the cache is emptied when it holds more

# Unicode White_Space: what \s matches in the Oniguruma regex HF tokenizers uses (str.isspace differs at U+001C-1F).
_WHITESPACE = frozenset(chr(c) for c in (*range(0x09, 0x0E), 0x20, 0x85, 0xA0, 0x1680, *range(0x2000, 0x200B),
                                         0x2028, 0x2029, 0x202F, 0x205F, 0x3000))
_LETTER, _NUMBER, _SPACE, _OTHER = "L", "N", "S", "O"


def _char_class(c: str) -> str:
    if c in _WHITESPACE:
        return _SPACE
    major = unicodedata.category(c)[0]
    return major if major in (_LETTER, _NUMBER) else _OTHER


_ASCII_CLASS = [_char_class(chr(c)) for c in range(128)]


def _classes(text: str) -> str:
    """One class letter per character of ``text``: L letter, N number, S whitespace, O anything else."""
    if text.isascii():
        return "".join([_ASCII_CLASS[ord(c)] for c in text])
    return "".join([_ASCII_CLASS[ord(c)] if c < "\x80" else _char_class(c) for c in text])


def _run_end(classes: str, start: int, cls: str) -> int:
    """End of the run of class ``cls`` that starts at ``start``."""
    end = start
    n = len(classes)
    while end < n and classes[end] == cls:
        end += 1
    return end


def _gpt2_words(text: str, classes: str) -> Iterator[str]:
    """GPT-2's ``'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+``, by hand."""
    i, n = 0, len(text)
    while i < n:
        c, cls = text[i], classes[i]
        if c == "'" and i + 1 < n and (text[i + 1] in "stmd" or text[i + 1:i + 3] in ("re", "ve", "ll")):
            j = i + (2 if text[i + 1] in "stmd" else 3)
        elif cls != _SPACE:
            j = _run_end(classes, i, cls)
        elif c == " " and i + 1 < n and classes[i + 1] != _SPACE:
            j = _run_end(classes, i + 1, classes[i + 1])
        else:  # a whitespace run: all of it at the end of the text, else all but its last character
            j = _run_end(classes, i, _SPACE)
            if j < n and j - 1 > i:
                j -= 1
        yield text[i:j]
        i = j


def pre_tokenize(text: str) -> list[str]:
    """SmolLM2's pre-tokenizer: every number character is a word of its own, the rest split by GPT-2's pattern."""
    classes = _classes(text)
    words: list[str] = []
    start = 0
    for i, cls in enumerate(classes):
        if cls == _NUMBER:
            if start < i:
                words.extend(_gpt2_words(text[start:i], classes[start:i]))
            words.append(text[i])
            start = i + 1
    if start < len(text):
        words.extend(_gpt2_words(text[start:], classes[start:]))
    return words


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


def _byte_alphabet() -> list[str]:
    """GPT-2's map from each byte to a printable character (printable Latin-1 bytes map to themselves)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


_BYTE_CHARS = _byte_alphabet()
_CHAR_BYTES = {c: b for b, c in enumerate(_BYTE_CHARS)}


def _token_bytes(token: str, special: bool) -> bytes:
    """The bytes a vocabulary entry stands for: its UTF-8 when special or not all in the byte alphabet."""
    if special or not all(c in _CHAR_BYTES for c in token):
        return token.encode()
    return bytes(_CHAR_BYTES[c] for c in token)


class Tokenizer:
    """A byte-level BPE tokenizer: ``encode`` text to token ids, ``decode`` ids to text.

    ``tokens`` are the vocabulary in GPT-2's byte alphabet, ``merges`` the pairs ``"a b"`` in rank order,
    ``token_types`` one ``TOKEN_*`` value per token; tokens of the control, user-defined and unknown types are
    special: matched verbatim in the text before pre-tokenization.
    """

    def __init__(self, tokens: Sequence[str], merges: Sequence[str], token_types: Sequence[int], *, bos_id: int,
                 eos_id: int, unk_id: int | None = None, pad_id: int | None = None, add_bos: bool = False) -> None:
        if len(token_types) != len(tokens):
            raise FormatError("tokenizer.ggml.token_type", f"{len(tokens)} entries (one per token)", len(token_types))
        self.vocab_size = len(tokens)
        self._vocab: dict[str, int] = {}
        for i, token in enumerate(tokens):
            if self._vocab.setdefault(token, i) != i:
                raise FormatError(f"tokenizer.ggml.tokens[{i}]", "a token not listed before", token)
        # A byte without a token of its own is dropped before merging, as HF tokenizers and llama.cpp do
        # (SmolLM2 has none for 21 bytes: a few control characters and bytes that never occur in UTF-8).
        self._byte_ids = [self._vocab.get(c, -1) for c in _BYTE_CHARS]
        self._dropped_bytes = bytes(b for b, i in enumerate(self._byte_ids) if i < 0)
        # (left id, right id) -> (rank, id of the merged token)
        self._ranks: dict[tuple[int, int], tuple[int, int]] = {}
        for rank, merge in enumerate(merges):
            pair = merge.split(" ")
            if len(pair) != 2 or not all(pair) or not all(p in self._vocab for p in pair) \
                    or pair[0] + pair[1] not in self._vocab:
                raise FormatError(f"tokenizer.ggml.merges[{rank}]", "'a b' where a, b and ab are tokens", merge)
            self._ranks.setdefault((self._vocab[pair[0]], self._vocab[pair[1]]), (rank, self._vocab[pair[0] + pair[1]]))
        for name, value in (("bos_token_id", bos_id), ("eos_token_id", eos_id), ("unknown_token_id", unk_id),
                            ("padding_token_id", pad_id)):
            if value is not None and not 0 <= value < self.vocab_size:
                raise FormatError(f"tokenizer.ggml.{name}", f"a token id in [0, {self.vocab_size})", value)
        self.bos_id, self.eos_id, self.unk_id, self.pad_id, self.add_bos = bos_id, eos_id, unk_id, pad_id, add_bos
        self.special_ids = frozenset(i for i, t in enumerate(token_types) if t in _SPECIAL_TYPES)
        specials = sorted((tokens[i] for i in self.special_ids if tokens[i]), key=lambda t: (-len(t), t))
        # Longest first: Python's alternation takes the first that matches, so this is leftmost-longest.
        self._special_re = re.compile("|".join(map(re.escape, specials))) if specials else None
        self._token_bytes = [_token_bytes(token, i in self.special_ids) for i, token in enumerate(tokens)]
        self.longest_token_bytes = max(1, max(map(len, self._token_bytes), default=0))
        """The most bytes of text one token stands for: a text of n bytes is at least n / this many tokens."""
        self._cache: dict[str, tuple[int, ...]] = {}

    @classmethod
    def from_gguf(cls, f: GGUFFile) -> Tokenizer:
        """The tokenizer stored in GGUF file ``f``; refuses models and pre-tokenizers not implemented here."""
        model = f.field("tokenizer.ggml.model", str)
        if model != "gpt2":
            raise FormatError("tokenizer.ggml.model", "'gpt2' (byte-level BPE)", model)
        pre = f.field("tokenizer.ggml.pre", str)
        if pre not in PRE_TOKENIZERS:
            raise FormatError("tokenizer.ggml.pre", f"one of {PRE_TOKENIZERS}", pre)

        def optional_id(key: str) -> int | None:
            return f.field(key, int) if key in f.metadata else None

        return cls(f.field("tokenizer.ggml.tokens", list, str), f.field("tokenizer.ggml.merges", list, str),
                   f.field("tokenizer.ggml.token_type", list, int),
                   bos_id=f.field("tokenizer.ggml.bos_token_id", int),
                   eos_id=f.field("tokenizer.ggml.eos_token_id", int),
                   unk_id=optional_id("tokenizer.ggml.unknown_token_id"),
                   pad_id=optional_id("tokenizer.ggml.padding_token_id"),
                   add_bos=f.field("tokenizer.ggml.add_bos_token", bool)
                   if "tokenizer.ggml.add_bos_token" in f.metadata else False)

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
            size = sum(len(r.translate(None, self._dropped_bytes)) for r in raw)
            fewest = len(bos) + -(-size // self.longest_token_bytes)
            if fewest > max_tokens:
                raise FieldError(field, f"at most {max_tokens} tokens", f"{size} bytes of text, at least {fewest} "
                                 f"tokens (a token stands for at most {self.longest_token_bytes} bytes)")
            limit = (max_tokens, field)
        ids = bos
        for text, parse_special in pieces:
            start = 0
            if parse_special and self._special_re is not None:
                for match in self._special_re.finditer(text):
                    self._encode_ordinary(text[start:match.start()], ids, limit)
                    ids.append(self._vocab[match.group()])
                    start = match.end()
            self._encode_ordinary(text[start:], ids, limit)
        if limit is not None:
            self._check_limit(ids, limit)
        return ids

    @staticmethod
    def _check_limit(ids: list[int], limit: tuple[int, str]) -> None:
        if len(ids) > limit[0]:
            raise FieldError(limit[1], f"at most {limit[0]} tokens", f"more than {limit[0]} tokens")

    def _encode_ordinary(self, text: str, out: list[int], limit: tuple[int, str] | None) -> None:
        cache = self._cache
        for word in pre_tokenize(text):
            word_ids = cache.get(word)
            if word_ids is None:
                word_ids = self._bpe(word)
                if len(cache) >= _CACHE_LIMIT:
                    cache.clear()
                cache[word] = word_ids
            out.extend(word_ids)
            if limit is not None:
                self._check_limit(out, limit)

    def _bpe(self, word: str) -> tuple[int, ...]:
        """Merge the word's byte symbols: the pair of lowest rank first, the leftmost among pairs of one rank.

        The symbols are a linked list; the heap holds (rank, left position, merged id) of candidate pairs, and a
        popped pair that no longer stands at its position (a neighbour merged) is skipped.
        """
        byte_ids = self._byte_ids
        ids = [i for i in map(byte_ids.__getitem__, word.encode()) if i >= 0]
        n = len(ids)
        if n < 2:
            return tuple(ids)
        get = self._ranks.get
        nxt = list(range(1, n + 1))
        nxt[-1] = -1
        prv = list(range(-1, n - 1))
        heap = []
        for i in range(n - 1):
            found = get((ids[i], ids[i + 1]))
            if found is not None:
                heap.append((found[0], i, found[1]))
        heapq.heapify(heap)
        while heap:
            rank, i, merged = heapq.heappop(heap)
            j = nxt[i]
            if j < 0 or ids[i] < 0:
                continue
            found = get((ids[i], ids[j]))
            if found is None or found[0] != rank:  # the pair at i has changed since it was pushed
                continue
            ids[i], ids[j] = merged, -1
            k = nxt[j]
            nxt[i] = k
            if k >= 0:
                prv[k] = i
                found = get((merged, ids[k]))
                if found is not None:
                    heapq.heappush(heap, (found[0], i, found[1]))
            p = prv[i]
            if p >= 0:
                found = get((ids[p], merged))
                if found is not None:
                    heapq.heappush(heap, (found[0], p, found[1]))
        return tuple(i for i in ids if i >= 0)

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

    Concatenating every ``push`` and the final ``flush`` gives ``Tokenizer.decode`` of the same tokens.
    """

    def __init__(self, tokenizer: Tokenizer, *, skip_special: bool = False) -> None:
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
