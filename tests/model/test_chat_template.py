"""The ChatML chat template, rendered in Python, against jinja2 rendering the GGUF's own template."""

from __future__ import annotations

import dataclasses
from typing import Any

import jinja2.sandbox
import pytest

from kvckpt_web.errors import FieldError, FormatError
from kvckpt_web.model.chat_template import TEMPLATE_KEY, ChatTemplate
from kvckpt_web.model.gguf import GGUFFile

SMOLLM_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"

# HF's generic ChatML template (no default system turn), with escaped newlines.
PLAIN_CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
                "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
                "{% endif %}")

LLAMA3 = ("{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
          "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + "
          "'<|eot_id|>' %}{{ content }}{% endfor %}")

CONVERSATIONS: list[list[dict[str, str]]] = [
    [],
    [{"role": "user", "content": "Hi!"}],
    [{"role": "system", "content": "Answer in French."}, {"role": "user", "content": "Hello"}],
    [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4."},
     {"role": "user", "content": "And 3+3?"}],
    [{"role": "assistant", "content": "I start."}, {"role": "user", "content": "ok"}],
    [{"role": "user", "content": "line one\nline two\n\n  indented\t tab"}],
    [{"role": "user", "content": ""}, {"role": "system", "content": "late system"}],
    [{"role": "user", "content": "unicode: café 日本語 😀 and specials <|im_end|> in text"}],
    [{"role": "tool", "content": "{\"result\": 42}"}, {"role": "user", "content": "{% raw %}{{ x }}"}],
]


def jinja_render(template: str, messages: list[dict[str, str]], add_generation_prompt: bool) -> str:
    """The template rendered as HF transformers renders chat templates."""
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    return env.from_string(template).render(messages=messages, add_generation_prompt=add_generation_prompt)


@pytest.fixture(scope="module")
def smollm_template(smollm: GGUFFile) -> str:
    return smollm.metadata[TEMPLATE_KEY]


@pytest.mark.parametrize("add_generation_prompt", [False, True])
@pytest.mark.parametrize("messages", CONVERSATIONS)
def test_render_equals_jinja_of_the_gguf_template(smollm: GGUFFile, smollm_template: str,
                                                  messages: list[dict[str, str]], add_generation_prompt: bool) -> None:
    ours = ChatTemplate.from_gguf(smollm).render(messages, add_generation_prompt=add_generation_prompt)
    assert ours == jinja_render(smollm_template, messages, add_generation_prompt)


@pytest.mark.parametrize("add_generation_prompt", [False, True])
@pytest.mark.parametrize("messages", CONVERSATIONS)
def test_render_equals_jinja_of_plain_chatml(messages: list[dict[str, str]], add_generation_prompt: bool) -> None:
    ours = ChatTemplate.from_text(PLAIN_CHATML).render(messages, add_generation_prompt=add_generation_prompt)
    assert ours == jinja_render(PLAIN_CHATML, messages, add_generation_prompt)


def test_smollm_template_has_its_default_system_turn(smollm: GGUFFile) -> None:
    assert ChatTemplate.from_gguf(smollm) == ChatTemplate(default_system=SMOLLM_SYSTEM)


def test_plain_chatml_has_no_default_system_turn() -> None:
    assert ChatTemplate.from_text(PLAIN_CHATML).default_system is None


def test_default_system_turn_comes_first() -> None:
    text = ChatTemplate("Be brief.").render([{"role": "user", "content": "Hi"}], add_generation_prompt=True)
    assert text == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                    "<|im_start|>assistant\n")


def test_refuses_another_template() -> None:
    with pytest.raises(FormatError, match=f"{TEMPLATE_KEY}: expected a ChatML template.*format the prompt yourself"):
        ChatTemplate.from_text(LLAMA3)


def test_refuses_a_chatml_variant_it_does_not_render_exactly(smollm_template: str) -> None:
    with pytest.raises(FormatError, match=TEMPLATE_KEY):
        ChatTemplate.from_text(smollm_template.replace("message['content']", "message['content'] | trim"))


def test_refuses_a_gguf_without_a_template(smollm: GGUFFile) -> None:
    f = dataclasses.replace(smollm, metadata={k: v for k, v in smollm.metadata.items() if k != TEMPLATE_KEY})
    with pytest.raises(FormatError, match=f"{TEMPLATE_KEY}: .*key missing"):
        ChatTemplate.from_gguf(f)


@pytest.mark.parametrize(("messages", "field"), [
    ("hello", "messages"),
    ([["user", "hi"]], "messages[0]"),
    ([{"role": "user", "content": "a"}, {"content": "b"}], "messages[1].role"),
    ([{"role": "", "content": "b"}], "messages[0].role"),
    ([{"role": "user", "content": None}], "messages[0].content"),
    ([{"role": "user", "content": ["a list"]}], "messages[0].content"),
])
def test_refuses_malformed_messages(messages: Any, field: str) -> None:
    with pytest.raises(FieldError) as info:
        ChatTemplate(SMOLLM_SYSTEM).render(messages)
    assert info.value.field == field
