"""The lines typed into ``kvckpt chat``: messages and slash commands, parsed without a model or a terminal."""

from __future__ import annotations

import pytest

from kvckpt_web.cli.chat_commands import HELP, COMMANDS, Command, parse_line
from kvckpt_web.errors import FieldError


def test_a_line_without_a_slash_is_a_message_as_typed():
    assert parse_line("  hello there ") == Command("say", "  hello there ")


def test_two_slashes_send_a_message_that_starts_with_one():
    assert parse_line("//etc/passwd is a file") == Command("say", "/etc/passwd is a file")


@pytest.mark.parametrize("line", ["", "   ", "\t"])
def test_a_blank_line_does_nothing(line):
    assert parse_line(line) == Command("empty")


@pytest.mark.parametrize("name", ["list", "regen", "continue", "help", "exit"])
def test_commands_without_an_argument(name):
    assert parse_line(f"/{name}") == Command(name)


@pytest.mark.parametrize("name", ["list", "regen", "exit"])
def test_an_argument_to_a_command_that_takes_none_is_refused_naming_it(name):
    with pytest.raises(FieldError) as err:
        parse_line(f"/{name} now")
    assert err.value.field == f"/{name}" and err.value.got == "now"


def test_new_takes_an_optional_conversation_name():
    assert parse_line("/new") == Command("new")
    assert parse_line("/new trip-notes") == Command("new", "trip-notes")


@pytest.mark.parametrize("line", ["/new a b", "/open ../x", "/new " + "x" * 129])
def test_a_name_that_is_no_conversation_name_is_refused_naming_the_command(line):
    with pytest.raises(FieldError) as err:
        parse_line(line)
    assert err.value.field == line.split()[0]


def test_open_takes_a_name_or_a_number_from_list():
    assert parse_line("/open trip-notes") == Command("open", "trip-notes")
    assert parse_line("/open 3") == Command("open", "", 3)


def test_open_without_an_argument_is_refused():
    with pytest.raises(FieldError) as err:
        parse_line("/open")
    assert err.value.field == "/open"


def test_edit_takes_an_optional_message_number_and_an_optional_text():
    assert parse_line("/edit") == Command("edit")
    assert parse_line("/edit 2") == Command("edit", "", 2)
    assert parse_line("/edit 2 what about the wind?") == Command("edit", "what about the wind?", 2)
    assert parse_line("/edit what about the wind?") == Command("edit", "what about the wind?")


def test_edit_of_message_0_is_refused():
    with pytest.raises(FieldError) as err:
        parse_line("/edit 0 hi")
    assert err.value.field == "/edit" and err.value.got == 0


def test_system_takes_the_rest_of_the_line():
    assert parse_line("/system  You answer in French. ") == Command("system", "You answer in French.")
    assert parse_line("/system") == Command("system")


def test_an_unknown_command_is_named():
    assert parse_line("/quit now") == Command("unknown", "quit")


def test_the_help_names_every_command():
    assert all(f"/{name}" in HELP for name in COMMANDS) and "\n" not in HELP
