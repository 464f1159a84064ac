"""The SentencePiece tokenizer a GGUF file carries (``tokenizer.ggml.model`` "llama": Gemma, Llama 2, Mistral).

The plain text between special tokens (:mod:`.tokenizer_base`) gets a space put first where the file's
``add_space_prefix`` says so (at the start and after each special token, as llama.cpp does), has its spaces
written as "▁" (U+2581), and is merged as llama.cpp's llm_tokenizer_spm merges it: from its characters, the
adjacent pair whose joined text is the token of the highest score merges first, the leftmost among equal scores,
until no adjacent pair joins into a token (a heap of candidate pairs over a linked list of symbols, O(n log n)),
in words cut where no token can join across.
A character without a token of its own becomes the tokens ``<0xNN>`` of its UTF-8 bytes (byte fallback).
Decoding writes "▁" back as a space and a byte token as its byte.
"""

from __future__ import annotations

import heapq
import math
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..errors import FormatError
from .tokenizer_base import (TOKEN_BYTE, TOKEN_CONTROL, TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_USER_DEFINED,
                             BaseTokenizer, gguf_options)

if TYPE_CHECKING:
    from .gguf import GGUFFile

__all__ = ["SPACE", "SentencePieceTokenizer"]

SPACE = "\u2581"
"""How SentencePiece writes a space in its tokens ("▁")."""


def _token_bytes(token: str, kind: int) -> bytes:
    """The bytes a vocabulary entry stands for, as llama.cpp's token_to_piece gives them (special tokens: their
    text; a token of another kind, an unused one, stands for nothing)."""
    if kind == TOKEN_NORMAL:
        return token.replace(SPACE, " ").encode()
    if kind == TOKEN_BYTE:
        return bytes([_byte_of(token)])
    if kind in (TOKEN_CONTROL, TOKEN_UNKNOWN, TOKEN_USER_DEFINED):
        return token.encode()
    return b""


def _byte_of(token: str) -> int:
    """The byte a byte token ``<0xNN>`` stands for."""
    if len(token) != 6 or not token.startswith("<0x") or not token.endswith(">"):
        raise FormatError("tokenizer.ggml.tokens", "byte tokens written <0xNN>", token)
    try:
        return int(token[3:5], 16)
    except ValueError:
        raise FormatError("tokenizer.ggml.tokens", "byte tokens written <0xNN>", token) from None


class SentencePieceTokenizer(BaseTokenizer):
    """A SentencePiece tokenizer: ``encode`` text to token ids, ``decode`` ids to text.

    ``tokens`` are the vocabulary as SentencePiece writes it ("▁" for a space, ``<0xNN>`` for a byte),
    ``scores`` one per token (a pair joins into the token of the highest score first), ``token_types`` one
    ``TOKEN_*`` value per token (special tokens as :class:`.tokenizer_base.BaseTokenizer`). ``add_space_prefix``
    puts a space before the text at the start and after each special token. ``decode`` gives the text back
    exactly where ``add_space_prefix`` is false (as Gemma's); otherwise with the spaces it put first.
    """

    def __init__(self, tokens: Sequence[str], scores: Sequence[float], token_types: Sequence[int], *, bos_id: int,
                 eos_id: int, unk_id: int | None = None, pad_id: int | None = None, add_bos: bool = True,
                 add_space_prefix: bool = True) -> None:
        if len(scores) != len(tokens):
            raise FormatError("tokenizer.ggml.scores", f"{len(tokens)} entries (one per token)", len(scores))
        for i, score in enumerate(scores):
            if not math.isfinite(score):
                raise FormatError(f"tokenizer.ggml.scores[{i}]", "a finite number", score)
        super().__init__(tokens, token_types, [_token_bytes(t, kind) for t, kind in zip(tokens, token_types)],
                         bos_id=bos_id, eos_id=eos_id, unk_id=unk_id, pad_id=pad_id, add_bos=add_bos)
        self.add_space_prefix = add_space_prefix
        self._scores = [float(s) for s in scores]
        # byte -> its token: <0xNN>, else the one-character token of an ASCII byte (as llama.cpp), else unknown
        byte_ids = [self._vocab.get(f"<0x{b:02X}>", self._vocab.get(chr(b)) if b < 0x80 else None)
                    for b in range(256)]
        missing = [b for b, i in enumerate(byte_ids) if i is None]
        if missing and unk_id is None:
            raise FormatError("tokenizer.ggml.tokens", "a byte token <0xNN> for every byte, or an unknown token",
                              f"none for {len(missing)} bytes, first <0x{missing[0]:02X}>")
        self._byte_ids = [unk_id if i is None else i for i in byte_ids]
        # Merging never joins across a "▁" whose left neighbour no token has before a "▁": the text is cut
        # there into words merged one by one (the same ids; a limit is checked, and words are cached, per word).
        bridges = sorted({t[k - 1] for t in tokens if SPACE in t[1:] for k in range(1, len(t)) if t[k] == SPACE})
        self._cuts = re.compile(f"(?<![{''.join(map(re.escape, bridges))}])(?={SPACE})" if bridges else f"(?={SPACE})")

    @classmethod
    def from_gguf(cls, f: GGUFFile) -> SentencePieceTokenizer:
        """The tokenizer stored in GGUF file ``f``; refuses a file of another tokenizer model. Where the file
        does not say, BOS is added and a space put first (llama.cpp's defaults for SentencePiece)."""
        model = f.field("tokenizer.ggml.model", str)
        if model != "llama":
            raise FormatError("tokenizer.ggml.model", "'llama' (SentencePiece)", model)
        prefix = "tokenizer.ggml.add_space_prefix"
        return cls(f.field("tokenizer.ggml.tokens", list, str), f.field("tokenizer.ggml.scores", list, float),
                   f.field("tokenizer.ggml.token_type", list, int),
                   add_space_prefix=f.field(prefix, bool) if prefix in f.metadata else True,
                   **gguf_options(f, add_bos=True))

    def _words(self, text: str, after_special: bool) -> list[str]:
        if self.add_space_prefix and after_special:
            text = " " + text
        return [word for word in self._cuts.split(text.replace(" ", SPACE)) if word]

    def _encode_word(self, text: str) -> tuple[int, ...]:
        """The ids of a word (spaces already "▁"): its characters merged pair by pair, the highest score first.

        Symbol ``i`` is ``text[i:i + size[i]]`` (size 0: merged into its left neighbour); the heap holds
        (-score, left, right, joined size) of candidate pairs, and a popped pair whose symbols changed since it
        was pushed (their sizes no longer add up to it) is skipped.
        """
        vocab, scores = self._vocab, self._scores
        n = len(text)
        size = [1] * n
        nxt = list(range(1, n + 1))
        nxt[-1] = -1
        prv = list(range(-1, n - 1))
        heap: list[tuple[float, int, int, int]] = []

        def candidate(left: int, right: int) -> None:
            token = vocab.get(text[left:right + size[right]])
            if token is not None:
                heapq.heappush(heap, (-scores[token], left, right, right + size[right] - left))

        for i in range(n - 1):
            candidate(i, i + 1)
        while heap:
            _, left, right, joined = heapq.heappop(heap)
            if size[left] == 0 or size[right] == 0 or size[left] + size[right] != joined:
                continue
            size[left], size[right] = joined, 0
            following = nxt[left] = nxt[right]
            if following >= 0:
                prv[following] = left
                candidate(left, following)
            if prv[left] >= 0:
                candidate(prv[left], left)
        ids: list[int] = []
        i = 0
        while i >= 0:
            piece = text[i:i + size[i]]
            token = vocab.get(piece)
            if token is not None:
                ids.append(token)
            else:
                ids.extend(self._byte_ids[b] for b in piece.encode())
            i = nxt[i]
        return tuple(ids)
