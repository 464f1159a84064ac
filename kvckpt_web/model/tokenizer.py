"""The byte-level BPE tokenizer a GGUF file carries (``tokenizer.ggml.model`` "gpt2", pre-tokenizer "smollm").

Encoding splits the text on special tokens (``<|im_start|>`` ...: :mod:`.tokenizer_base`), then pre-tokenizes each
remaining span
as SmolLM2's tokenizer.json does (every digit alone, then GPT-2's word pattern), maps each word's UTF-8
bytes to GPT-2's printable byte alphabet and merges symbol pairs by rank, lowest first, leftmost among equals
(as HF tokenizers and llama.cpp do: a heap of candidate pairs over a linked list of symbols, O(n log n) in a
word's length). A limit on the tokens is enforced before any work where the text's size alone exceeds it,
else as soon as the tokens produced exceed it. Decoding maps tokens back to bytes; invalid UTF-8 becomes
U+FFFD, and :class:`StreamDecoder` holds back incomplete characters while streaming.
"""

from __future__ import annotations

import heapq
import unicodedata
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from ..errors import FormatError
from .tokenizer_base import TOKEN_CONTROL, TOKEN_UNKNOWN, TOKEN_USER_DEFINED, BaseTokenizer, gguf_options

if TYPE_CHECKING:
    from .gguf import GGUFFile

__all__ = ["PRE_TOKENIZERS", "Tokenizer", "pre_tokenize"]

PRE_TOKENIZERS = ("smollm",)
"""``tokenizer.ggml.pre`` values whose pre-tokenizer is implemented here."""

_VERBATIM_TYPES = (TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER_DEFINED)  # their text is UTF-8, not the byte alphabet

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


def _token_bytes(token: str, verbatim: bool) -> bytes:
    """The bytes a vocabulary entry stands for: its UTF-8 when verbatim or not all in the byte alphabet."""
    if verbatim or not all(c in _CHAR_BYTES for c in token):
        return token.encode()
    return bytes(_CHAR_BYTES[c] for c in token)


class Tokenizer(BaseTokenizer):
    """A byte-level BPE tokenizer: ``encode`` text to token ids, ``decode`` ids to text.

    ``tokens`` are the vocabulary in GPT-2's byte alphabet, ``merges`` the pairs ``"a b"`` in rank order,
    ``token_types`` one ``TOKEN_*`` value per token (special tokens as :class:`.tokenizer_base.BaseTokenizer`).
    """

    def __init__(self, tokens: Sequence[str], merges: Sequence[str], token_types: Sequence[int], *, bos_id: int,
                 eos_id: int, unk_id: int | None = None, pad_id: int | None = None, add_bos: bool = False) -> None:
        super().__init__(tokens, token_types, [_token_bytes(token, kind in _VERBATIM_TYPES)
                                               for token, kind in zip(tokens, token_types)],
                         bos_id=bos_id, eos_id=eos_id, unk_id=unk_id, pad_id=pad_id, add_bos=add_bos)
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

    @classmethod
    def from_gguf(cls, f: GGUFFile) -> Tokenizer:
        """The tokenizer stored in GGUF file ``f``; refuses models and pre-tokenizers not implemented here."""
        model = f.field("tokenizer.ggml.model", str)
        if model != "gpt2":
            raise FormatError("tokenizer.ggml.model", "'gpt2' (byte-level BPE)", model)
        pre = f.field("tokenizer.ggml.pre", str)
        if pre not in PRE_TOKENIZERS:
            raise FormatError("tokenizer.ggml.pre", f"one of {PRE_TOKENIZERS}", pre)
        return cls(f.field("tokenizer.ggml.tokens", list, str), f.field("tokenizer.ggml.merges", list, str),
                   f.field("tokenizer.ggml.token_type", list, int), **gguf_options(f, add_bos=False))

    def _min_text_bytes(self, raw: bytes) -> int:
        return len(raw.translate(None, self._dropped_bytes))

    def _words(self, text: str, after_special: bool) -> list[str]:
        return pre_tokenize(text)

    def _encode_word(self, word: str) -> tuple[int, ...]:
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
