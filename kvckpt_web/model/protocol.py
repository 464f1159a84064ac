"""What a generation session needs of a model and of its text codec.

A :class:`CausalLM` runs tokens through a causal language model whose K/V live in a
:class:`~kvckpt_web.kv.cache.PagedKVCache`; :class:`Logits` are its output for the last token,
kept where the model computed them (on the GPU for the WGSL runner) until asked for.
A :class:`TextCodec` turns chat messages or a raw prompt into token ids and ids back into text.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from .sampler import Sampler

if TYPE_CHECKING:
    from ..kv.cache import PagedKVCache
    from ..tvm.layout import KVLayout


MAX_TOP_LOGPROBS = 20
"""The most alternatives :meth:`Logits.logprobs` lists (OpenAI's ``top_logprobs`` bound)."""


@dataclass(frozen=True)
class TokenLogprob:
    """A token's log probability under the model: the raw logits' log-softmax (temperature 1, before any penalty),
    and the ``top`` most likely tokens' as (token id, log probability), most likely first."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


class Logits(Protocol):
    """The next-token logits of the last token a forward ran (of one run of a batched forward)."""

    async def argmax(self) -> int:
        """The id of the largest logit (ties: the lowest id)."""
        ...

    async def top_k(self, k: int) -> list[tuple[int, float]]:
        """The ``k`` largest logits (all of them if ``k`` is at least the vocabulary) as (token id, logit),
        largest first (ties: lower id first)."""
        ...

    async def logprobs(self, token: int, top: int) -> TokenLogprob:
        """The log probability of ``token`` and of the ``top`` (0 to :data:`MAX_TOP_LOGPROBS`) most likely tokens."""
        ...

    async def pick(self, sampler: Sampler, previous: Sequence[int], generated: Sequence[int]) -> int:
        """The token ``sampler`` chooses from these logits after ``previous`` (the prompt and the tokens generated
        so far), ``generated`` those of this reply: what :meth:`Sampler.pick` gives from all of them."""
        ...


async def choose(logits: Logits, sampler: Sampler, previous: Sequence[int], generated: Sequence[int]) -> int:
    """The next token ``sampler`` picks from ``logits`` after ``previous`` (``generated`` the reply's part of them):
    their argmax when greedy without penalties (no random draw), else :meth:`Logits.pick`."""
    if sampler.settings.greedy and not sampler.penalizes:
        return await logits.argmax()
    return await logits.pick(sampler, previous, generated)


@runtime_checkable
class CausalLM(Protocol):
    """A causal language model that keeps its K/V in a paged cache."""

    identity: str
    """A digest of the model file (header, tensor table and weights): checkpoints record it."""
    kernels: str
    """A digest of the code that computes its K/V (the same weights run by other kernels may differ in the
    last bits): what K/V reused across processes are scoped by, with the identity and the cache layout."""
    max_context: int
    """The most tokens (positions) one sequence may hold."""
    vocab_size: int
    """How many token ids the logits cover."""

    def kv_layout(self, page_size: int = 16) -> "KVLayout":
        """The layout of the K/V this model writes, with pages of ``page_size`` tokens."""
        ...

    async def forward(self, cache: "PagedKVCache", seq_id: int, tokens: list[int]) -> Logits:
        """Run ``tokens`` (a prefill chunk or one decode token) after what ``seq_id`` holds; append their K/V to
        it (one forward pass of the cache) and return the last token's logits."""
        ...

    async def forward_batch(self, cache: "PagedKVCache", runs: list[tuple[int, list[int]]]) -> list[Logits]:
        """Run each (seq_id, tokens) of ``runs`` after what its sequence holds, in one forward pass of the cache
        (one ``begin_forward`` over all the seq_ids, one weight fetch for all rows), and return each run's
        last-token logits in the order of ``runs``, valid until the model's next forward. All the runs' tokens
        together fit one forward (decode tokens, prefill chunks: at most the cache's prefill_chunk_size). A run's
        logits and K/V are the bits of :meth:`forward` of that run alone, whatever else the batch holds."""
        ...

    def close(self) -> None:
        """Release the model's GPU memory (idempotent); it cannot run afterwards."""
        ...


class TextCodec(Protocol):
    """A model's tokenizer and chat template (the chat methods raise FieldError naming ``messages`` for a model that
    cannot chat: a base model answers plain completions only)."""

    eos_ids: tuple[int, ...]
    """Token ids that end a reply."""

    def encode_chat(self, messages: Sequence[dict[str, str]], *, max_tokens: int | None = None) -> list[int]:
        """The prompt token ids of a conversation (``{"role", "content"}`` messages), ready for the reply: the
        :meth:`preamble`, each message's :meth:`encode_message`, then the :meth:`reply_opening`; the messages'
        text is text (never the template's control tokens). FieldError naming ``prompt`` if it takes more than
        ``max_tokens`` tokens, found without encoding more than that."""
        ...

    def preamble(self, first_role: str) -> list[int]:
        """The ids before the first message (of role ``first_role``): a BOS, a default system turn, or none."""
        ...

    def encode_message(self, role: str, content: str, *, previous: str | None = None,
                       max_tokens: int | None = None) -> list[int]:
        """The ids of one message's turn after a message of role ``previous`` (None: the first), its content
        encoded as text (FieldError beyond ``max_tokens``)."""
        ...

    def reply_opening(self) -> list[int]:
        """The ids that open the assistant's turn; the model writes its reply after them."""
        ...

    def encode_prefill(self, content: str, *, previous: str | None = None,
                       max_tokens: int | None = None) -> list[int]:
        """The ids of an assistant's turn the model continues from ``content`` (a chat's last message, the
        assistant's): the :meth:`reply_opening` and the content as text, nothing closing it."""
        ...

    def reply_closing(self) -> list[int]:
        """The ids that close an assistant turn after the reply's ids (an end-of-turn id left out)."""
        ...

    def encode_text(self, text: str, *, max_tokens: int | None = None) -> list[int]:
        """The prompt token ids of a plain completion's raw ``text``: the model's BOS if it adds one, then the text
        as is (FieldError naming ``prompt`` beyond ``max_tokens``)."""
        ...

    def decode(self, tokens: Sequence[int]) -> str:
        """The text of ``tokens``; an incomplete UTF-8 sequence at the end decodes to U+FFFD."""
        ...

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes one token stands for (a special token: its text in UTF-8)."""
        ...

    def token_pieces(self) -> list[bytes]:
        """The bytes of the text each token id stands for, empty for a special token (text never holds one): what
        a reply held to a JSON format is checked against."""
        ...


@dataclass(frozen=True)
class LoadedModel:
    """A model ready to generate: the network and the codec of its text."""

    model: CausalLM
    text: TextCodec
