"""The chat engine: OpenAI-shaped multi-turn chat on the paged cache, with prefix reuse in memory and from the
store, and replies that survive a crash (see :mod:`kvckpt_web.engine.engine`)."""

from .config import PRESETS, EngineConfig
from .listing import ConversationInfo
from .engine import Engine
from .remote import pull, push
from .request import ChatRequest, CompletionRequest, Message
from .responses import ChatChunk, ChatCompletion, ChatStream, Timings, Usage

__all__ = ["PRESETS", "ChatChunk", "ChatCompletion", "ChatRequest", "ChatStream", "CompletionRequest", "ConversationInfo", "Engine", "EngineConfig",
           "Message", "Timings", "Usage", "pull", "push"]
