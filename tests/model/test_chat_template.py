"""The chat templates, rendered in Python, against jinja2 rendering each family's own published template."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import jinja2.sandbox
import pytest

from kvckpt_web.errors import FieldError, FormatError
from kvckpt_web.model.chat_template import TEMPLATE_KEY, ChatML, ChatTemplate, Gemma, Llama3, Qwen3
from kvckpt_web.model.gguf import GGUFFile

TEMPLATES = Path(__file__).parent / "chat_templates"
SMOLLM_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"

# HF's generic ChatML template (no default system turn), with escaped newlines.
PLAIN_CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
                "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
                "{% endif %}")

# Conversations as the engine sends them: system, user and assistant messages, the last one the user's.
CHATS: list[list[dict[str, str]]] = [
    [{"role": "user", "content": "Hi!"}],
    [{"role": "system", "content": "Answer in French."}, {"role": "user", "content": "Hello"}],
    [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4."},
     {"role": "user", "content": "And 3+3?"}],
    [{"role": "system", "content": "  Be brief.\n"}, {"role": "user", "content": "  padded  \n"},
     {"role": "assistant", "content": "\nok "}, {"role": "user", "content": "again"}],
    [{"role": "user", "content": "line one\nline two\n\n  indented\t tab"}],
    [{"role": "user", "content": "unicode: café 日本語 😀 and specials <|im_end|> <end_of_turn> <|eot_id|> in text"}],
    [{"role": "user", "content": "{% raw %}{{ x }}"}],
    [{"role": "user", "content": "think"}, {"role": "assistant", "content": "<think>\nhm\n</think>\n\nSix."},
     {"role": "user", "content": "why?"}],
]
# Other shapes, for the templates that take any order of roles.
ANY_ORDER: list[list[dict[str, str]]] = [
    [],
    [{"role": "assistant", "content": "I start."}, {"role": "user", "content": "ok"}],
    [{"role": "user", "content": ""}, {"role": "system", "content": "late system"}],
    [{"role": "tool", "content": "{\"result\": 42}"}, {"role": "user", "content": "{% raw %}{{ x }}"}],
]


def jinja_render(template: str, messages: list[dict[str, str]], add_generation_prompt: bool) -> str:
    """The template rendered as HF transformers renders chat templates, with an empty BOS (the tokenizer adds
    the model's)."""
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = lambda message: pytest.fail(f"the template refused: {message}")
    return env.from_string(template).render(messages=messages, add_generation_prompt=add_generation_prompt,
                                            bos_token="")


def published(name: str) -> str:
    return (TEMPLATES / f"{name}.jinja").read_text()


@pytest.fixture(scope="module")
def smollm_template(smollm: GGUFFile) -> str:
    return smollm.metadata[TEMPLATE_KEY]


@pytest.mark.parametrize(("name", "family"), [
    ("qwen2", ChatML("You are a helpful assistant.")),
    ("qwen2.5", ChatML("You are Qwen, created by Alibaba Cloud. You are a helpful assistant.")),
    ("qwen3", Qwen3()), ("gemma-3", Gemma()), ("llama-3", Llama3()), ("llama-3.2", Llama3(dated=True)),
])
def test_each_published_template_is_recognised_as_its_family(name: str, family: ChatTemplate) -> None:
    assert ChatTemplate.from_text(published(name)) == family


def test_smollm_template_is_chatml_with_its_default_system_turn(smollm: GGUFFile) -> None:
    assert ChatTemplate.from_gguf(smollm) == ChatML(default_system=SMOLLM_SYSTEM)


def test_plain_chatml_has_no_default_system_turn() -> None:
    assert ChatTemplate.from_text(PLAIN_CHATML) == ChatML(None)


@pytest.mark.parametrize("add_generation_prompt", [False, True])
@pytest.mark.parametrize("messages", CHATS)
@pytest.mark.parametrize("name", ["qwen2", "qwen2.5", "qwen3", "gemma-3", "llama-3", "llama-3.2"])
def test_render_equals_jinja_of_the_published_template(name: str, messages: list[dict[str, str]],
                                                        add_generation_prompt: bool) -> None:
    template = published(name)
    ours = ChatTemplate.from_text(template).render(messages, add_generation_prompt=add_generation_prompt)
    assert ours == jinja_render(template, messages, add_generation_prompt)


@pytest.mark.parametrize("add_generation_prompt", [False, True])
@pytest.mark.parametrize("messages", CHATS + ANY_ORDER)
def test_render_equals_jinja_of_the_gguf_template(smollm: GGUFFile, smollm_template: str,
                                                  messages: list[dict[str, str]], add_generation_prompt: bool) -> None:
    ours = ChatTemplate.from_gguf(smollm).render(messages, add_generation_prompt=add_generation_prompt)
    assert ours == jinja_render(smollm_template, messages, add_generation_prompt)


@pytest.mark.parametrize("add_generation_prompt", [False, True])
@pytest.mark.parametrize("messages", CHATS + ANY_ORDER)
def test_render_equals_jinja_of_plain_chatml(messages: list[dict[str, str]], add_generation_prompt: bool) -> None:
    ours = ChatTemplate.from_text(PLAIN_CHATML).render(messages, add_generation_prompt=add_generation_prompt)
    assert ours == jinja_render(PLAIN_CHATML, messages, add_generation_prompt)


@pytest.mark.parametrize("name", ["qwen2", "qwen2.5", "qwen3", "gemma-3", "llama-3", "llama-3.2", "smollm"])
def test_a_developer_message_renders_as_the_system_turn(name: str, smollm_template: str) -> None:
    template = smollm_template if name == "smollm" else published(name)
    chat = [{"role": "system", "content": "Answer in French."}, {"role": "user", "content": "Hello"}]
    as_developer = [{"role": "developer", "content": "Answer in French."}, chat[1]]
    ours = ChatTemplate.from_text(template).render(as_developer, add_generation_prompt=True)
    assert ours == jinja_render(template, chat, True)


@pytest.mark.parametrize("content", ["The sea is", " {\n  \"name\": ", ""])
@pytest.mark.parametrize("name", ["qwen2", "qwen2.5", "qwen3", "gemma-3", "llama-3", "llama-3.2", "smollm"])
def test_a_prefill_is_the_opened_assistant_turn_and_its_text_as_it_is(name: str, content: str,
                                                                       smollm_template: str) -> None:
    template = smollm_template if name == "smollm" else published(name)
    history = [{"role": "user", "content": "Describe the sea."}]
    family = ChatTemplate.from_text(template)
    ours = family.render(history) + "".join(text for text, _ in family.prefill_pieces(content, "user"))
    assert ours == jinja_render(template, history, True) + content


def test_gemma_refuses_a_prefill_after_an_assistant_message() -> None:
    with pytest.raises(FieldError, match="messages: expected roles alternating"):
        Gemma().prefill_pieces("more", "assistant")


def test_default_system_turn_comes_first() -> None:
    text = ChatML("Be brief.").render([{"role": "user", "content": "Hi"}], add_generation_prompt=True)
    assert text == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                    "<|im_start|>assistant\n")


def test_gemma_puts_the_system_message_at_the_start_of_the_first_user_turn() -> None:
    text = Gemma().render([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
                          add_generation_prompt=True)
    assert text == "<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\n"


@pytest.mark.parametrize("messages", [
    [{"role": "assistant", "content": "I start."}, {"role": "user", "content": "ok"}],
    [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}],
    [{"role": "user", "content": "a"}, {"role": "system", "content": "late"}, {"role": "user", "content": "b"}],
])
def test_gemma_refuses_roles_that_do_not_alternate_as_its_template_does(messages: list[dict[str, str]]) -> None:
    with pytest.raises(FieldError, match="messages: expected roles alternating user/assistant"):
        Gemma().render(messages)


def test_gemma_2_refuses_a_system_message() -> None:
    template = published("gemma-3").replace("{{ bos_token }}", "{{ bos_token }}{% if messages[0]['role'] == "
                                            "'system' %}{{ raise_exception('System role not supported') }}{% endif %}")
    with pytest.raises(FieldError, match="'system' first"):
        ChatTemplate.from_text(template).render([{"role": "system", "content": "x"}, {"role": "user", "content": "y"}])


def test_llama_3_1_dates_its_system_turn_with_the_templates_default_day() -> None:
    text = Llama3(dated=True).render([{"role": "user", "content": "Hi"}], add_generation_prompt=True)
    assert text == ("<|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\n"
                    "Today Date: 26 Jul 2024\n\n<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
                    "<|start_header_id|>assistant<|end_header_id|>\n\n")


@pytest.mark.parametrize("template", [
    "{% for message in messages %}[INST] {{ message['content'] }} [/INST]{% endfor %}",
    "{{ messages[0]['content'] }}" + " filler" * 40,
])
def test_refuses_a_template_of_no_known_family_naming_it(template: str) -> None:
    with pytest.raises(FormatError) as info:
        ChatTemplate.from_text(template)
    message = str(info.value)
    assert message.startswith(f"{TEMPLATE_KEY}: expected a chat template of a known family (ChatML, Qwen3, Gemma, "
                              "Llama 3), got ")
    assert template[:40] in message and len(message.splitlines()) == 1 and len(message) < 300


@pytest.mark.parametrize(("name", "old", "new"), [
    ("qwen2.5", "'<|im_start|>assistant\\n' }}", "'<|im_start|>assistant\\n<think>\\n' }}"),  # QwQ's opening
    ("qwen3", "last_query_index", "last_user_index"),  # <think> without Qwen3's rule for earlier replies
    ("gemma-3", "'<start_of_turn>model\\n'", "'<start_of_turn>model\\n<thought>'"),
    ("llama-3", "'<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}",
     "'<|start_header_id|>assistant<|end_header_id|>\\n\\n<|python_tag|>' }}"),
], ids=["chatml-opening-otherwise", "think-without-qwen3s-rule", "gemma-opening-otherwise", "llama-3-opening-otherwise"])
def test_a_template_with_a_familys_markers_used_otherwise_is_refused(name: str, old: str, new: str) -> None:
    template = published(name)
    assert old in template
    with pytest.raises(FormatError, match=f"^{TEMPLATE_KEY}: expected a chat template of a known family"):
        ChatTemplate.from_text(template.replace(old, new))


def test_a_gguf_without_a_template_has_none(smollm: GGUFFile) -> None:
    f = dataclasses.replace(smollm, metadata={k: v for k, v in smollm.metadata.items() if k != TEMPLATE_KEY})
    assert ChatTemplate.from_gguf(f) is None


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
        ChatML(SMOLLM_SYSTEM).render(messages)
    assert info.value.field == field
