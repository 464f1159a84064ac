"""The tokenizer kinds a GGUF file may name (``tokenizer.ggml.model``) and the one place a file's tokenizer is
built: byte-level BPE ("gpt2": SmolLM2, Llama 3, Qwen) and SentencePiece ("llama": Gemma, Llama 2)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import FormatError
from .spm_tokenizer import SentencePieceTokenizer
from .tokenizer import Tokenizer
from .tokenizer_base import BaseTokenizer

if TYPE_CHECKING:
    from .gguf import GGUFFile

__all__ = ["TOKENIZER_KINDS", "tokenizer_from_gguf"]

TOKENIZER_KINDS: dict[str, type[Tokenizer] | type[SentencePieceTokenizer]] = {
    "gpt2": Tokenizer, "llama": SentencePieceTokenizer}
"""``tokenizer.ggml.model`` -> the class of its tokenizer."""


def tokenizer_from_gguf(f: GGUFFile) -> BaseTokenizer:
    """The tokenizer stored in GGUF file ``f``, of the kind its ``tokenizer.ggml.model`` names; FormatError
    naming the key for a kind not implemented here."""
    model = f.field("tokenizer.ggml.model", str)
    kind = TOKENIZER_KINDS.get(model)
    if kind is None:
        raise FormatError("tokenizer.ggml.model", "'gpt2' (byte-level BPE) or 'llama' (SentencePiece)", model)
    return kind.from_gguf(f)
