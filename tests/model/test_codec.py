"""The text codec of a GGUF chat model: ChatML prompts in, reply text out, the turn's end as EOS."""

from __future__ import annotations

from kvckpt_web.model.chat import ChatTemplate
from kvckpt_web.model.codec import ChatCodec
from kvckpt_web.model.tokenizer import Tokenizer


def test_a_chat_prompt_is_the_rendered_template_encoded_and_ends_with_the_assistant_turn(smollm):
    codec = ChatCodec.from_gguf(smollm)
    messages = [{"role": "user", "content": "What is a lighthouse?"}]
    ids = codec.encode_chat(messages)
    text = ChatTemplate.from_gguf(smollm).render(messages, add_generation_prompt=True)
    assert ids == Tokenizer.from_gguf(smollm).encode(text)
    assert codec.tokenizer.decode(ids).endswith("<|im_start|>assistant\n")


def test_the_end_of_a_chatml_turn_ends_a_reply(smollm):
    codec = ChatCodec.from_gguf(smollm)
    (im_end,) = codec.tokenizer.encode("<|im_end|>")
    assert im_end in codec.eos_ids and codec.tokenizer.eos_id in codec.eos_ids


def test_reply_text_leaves_special_tokens_out(smollm):
    codec = ChatCodec.from_gguf(smollm)
    ids = codec.tokenizer.encode("Hello, sea!<|im_end|>")
    assert codec.decode(ids) == "Hello, sea!"
