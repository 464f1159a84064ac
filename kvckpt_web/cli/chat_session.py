"""One ``kvckpt chat`` session: the conversation on screen, the lines typed into it, the replies streamed back.

The engine holds the conversations (in its store: each reply autosaved as it is written); the session holds
which one is on screen and its messages as the engine last saved them, and sends the whole list each turn.
A reply that ends (finished, interrupted, or failed) reloads them from the engine, so what the next turn sends
is what the store holds, the engine's own reply ids recognised. Errors are one line and the chat goes on.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable
from typing import Any

from ..engine import ChatChunk, Engine, Message
from ..engine.engine import new_name
from ..errors import ContextFullError, FieldError, KVCkptError
from .chat_commands import HELP, Command, parse_line
from .chat_terminal import Terminal, conversation_row, reply_status

__all__ = ["ChatSession"]


class ChatSession:
    """A chat over ``engine`` on ``terminal``; ``settings`` are each request's sampling settings (``seed``,
    ``temperature``, ...), ``system`` the system prompt of new conversations (None: the model's default)."""

    def __init__(self, engine: Engine, terminal: Terminal, *, settings: dict[str, Any], system: str | None) -> None:
        self.engine = engine
        self.term = terminal
        self.settings = settings
        self.system = system
        self.name: str | None = None
        """The conversation on screen (None: a new one, named by the engine when its first reply is saved)."""
        self.messages: list[Message] = []
        self.replying = False
        self._stopping = False

    def stop_reply(self) -> bool:
        """Ctrl-C: stop the reply being generated after its current token (it stays resumable: ``/continue``);
        False if no reply is being generated (Ctrl-C then ends the chat)."""
        if not self.replying:
            return False
        self._stopping = True
        self.term.ctrl_c()
        self.engine.interrupt()
        return True

    async def run(self, conversation: str | None) -> None:
        """Open ``conversation`` (see :meth:`start`), then read and do lines until ``/exit`` or the end of input
        (KeyboardInterrupt, from Ctrl-C at the prompt, goes to the caller)."""
        await self.start(conversation)
        while True:
            try:
                line = self.term.read_line("you> ")
            except EOFError:
                self.term.newline()
                return
            except KeyboardInterrupt:
                self.term.newline()
                raise
            if not await self.handle(line):
                return

    async def start(self, conversation: str | None) -> None:
        """Open conversation ``conversation``, or begin a new one of that name if there is none; without a name,
        reopen the most recent conversation if its last reply was cut (a crash, Ctrl-C) and no other process is
        writing it, else begin a new one."""
        if conversation is not None and not await self._exists(conversation):
            return self._begin(conversation)
        if conversation is not None:
            await self._guarded(self._open(conversation, "--conversation"))
            if self.name is not None and self.system is not None:
                self.term.note(f"--system applies to new conversations: {self.name} keeps its own")
        else:
            cut = [info for info in await self.engine.unfinished() if info.prompt is None]  # chats only
            latest = await self.engine.conversations()
            if cut and latest[0].name == cut[0].name and not await self._guarded(self._open(cut[0].name, "/open")):
                self.name = None  # e.g. another process is writing it still: not the one to go on with here
        if self.name is None:
            self._begin(None)

    async def handle(self, line: str) -> bool:
        """Do what ``line`` asks; False once it asks to end the chat."""
        try:
            command = parse_line(line)
        except KVCkptError as exc:
            self.term.error(str(exc))
            return True
        if command.name == "exit":
            return False
        await self._guarded(getattr(self, f"_do_{command.name}")(command))
        return True

    async def _guarded(self, work: Awaitable[None]) -> bool:
        """Do ``work``; an error it raises is one line on the terminal (and False)."""
        try:
            await work
        except ContextFullError as exc:
            self.term.error(f"{exc}; /new starts a new conversation")
        except (KVCkptError, OSError) as exc:
            self.term.error(str(exc))
        else:
            return True
        return False

    # ----- conversations ------------------------------------------------------------------------

    async def _exists(self, name: str) -> bool:
        return any(info.name == name for info in await self.engine.conversations())

    def _begin(self, name: str | None) -> None:
        """A new conversation on screen (its first reply saves it, as ``name`` or a name the engine gives)."""
        self.name = name
        self.messages = [Message("system", self.system)] if self.system is not None else []
        self.term.note(f"new conversation {name}" if name else "new conversation")
        for message in self.messages:
            self.term.message(message.role, message.content)

    async def _open(self, name: str, field: str) -> None:
        """Show conversation ``name``'s history, then continue its last reply if that was cut."""
        info = await self.engine.conversation(name)
        if info.error is not None or not info.same_model:
            raise FieldError(field, "a conversation of this model that can be read", name,
                             info.error or "written by another model")
        if info.prompt is not None:
            raise FieldError(field, "a chat conversation", name, "a plain completion's, of a raw prompt")
        self.name, self.messages = name, list(info.messages)
        self.term.note(f"{name}: {len(info.messages)} messages, {info.tokens} tokens")
        cut = not info.finished
        last_reply = cut and self.messages[-1].role == "assistant"
        for message in self.messages[:len(self.messages) - last_reply]:
            self.term.message(message.role, message.content)
        if cut:
            # what the history shows of the cut reply: its text but an unfinished last character, which the
            # resumed reply's first chunk (all the text written before) holds back as well
            shown = self.messages[-1].content.rstrip("\ufffd") if last_reply else ""
            self.term.reply(shown)
            await self._reply(self.engine.resume(name, stream=True), shown, resumed=True)

    async def _reload(self) -> None:
        """The messages of the conversation on screen as the engine saved them (its last reply included)."""
        self.messages = list((await self.engine.conversation(self.name)).messages)

    # ----- replies ------------------------------------------------------------------------------

    async def _ask(self, messages: list[Message], conversation: str | None, **overrides: Any) -> None:
        """The reply to ``messages``, saved as ``conversation`` (None: a new name, given by the session, so that the
        conversation counts as named: a server's retention of unnamed conversations never deletes it)."""
        name = conversation if conversation is not None else new_name("chat")
        request = self.engine.chat(messages, stream=True, conversation=name, **{**self.settings, **overrides})
        await self._reply(request, "", resumed=False)

    async def _reply(self, request: Awaitable[AsyncIterator[ChatChunk]], shown: str, resumed: bool) -> None:
        """Stream the reply ``request`` starts (after ``shown``, the text of it the screen has already), then
        reload the conversation and say how the reply went."""
        self.replying, self._stopping = True, False
        try:
            first, last = await self._show(await request, shown)
        finally:
            self.replying = False
        self.name = last.conversation
        await self._reload()
        self.term.note(reply_status(self.name, last, len(first.token_ids) if resumed else None))

    async def _show(self, chunks: AsyncIterator[ChatChunk], shown: str) -> tuple[ChatChunk, ChatChunk]:
        """Print the text of ``chunks`` past its first ``len(shown)`` characters as it comes (and the warnings of
        the first, before it); the first and the last chunk."""
        text, printed, first, last = "", len(shown), None, None
        async for chunk in chunks:
            if self._stopping:  # Ctrl-C came before the reply's first step
                self.engine.interrupt()
            for warning in chunk.warnings:
                self.term.warning(warning)
            text += chunk.text
            if len(text) > printed:
                self.term.reply(text[printed:])
                printed = len(text)
            first, last = first or chunk, chunk
        self.term.end_reply()
        return first, last

    # ----- commands -----------------------------------------------------------------------------

    async def _do_empty(self, command: Command) -> None:
        pass

    async def _do_say(self, command: Command) -> None:
        await self._ask([*self.messages, Message("user", command.text)], self.name)

    async def _do_unknown(self, command: Command) -> None:
        self.term.error(f"unknown command /{command.text}; {HELP}")

    async def _do_help(self, command: Command) -> None:
        self.term.note(HELP)

    async def _do_new(self, command: Command) -> None:
        if command.text and await self._exists(command.text):
            raise FieldError("/new", "a name no conversation has", command.text, f"/open {command.text} opens it")
        self._begin(command.text or None)

    async def _do_list(self, command: Command) -> None:
        infos = await self.engine.conversations()
        if not infos:
            self.term.note("no conversations yet")
        for number, info in enumerate(infos, 1):
            self.term.line(conversation_row(number, info, info.name == self.name))

    async def _do_open(self, command: Command) -> None:
        name = command.text
        if command.number is not None:
            infos = await self.engine.conversations()
            if not 1 <= command.number <= len(infos):
                raise FieldError("/open", f"a number from /list (1 to {len(infos)})", command.number)
            name = infos[command.number - 1].name
        await self._open(name, "/open")

    async def _do_continue(self, command: Command) -> None:
        if self.name is None:
            raise FieldError("/continue", "a conversation whose last reply was cut", "a new conversation")
        self.term.note(f"continuing the last reply of {self.name}")
        await self._reply(self.engine.resume(self.name, stream=True), "", resumed=True)

    def _user_messages(self, field: str) -> list[int]:
        """Where the user's messages are in the conversation (FieldError naming ``field`` if it has none)."""
        users = [i for i, m in enumerate(self.messages) if m.role == "user"]
        if not users:
            raise FieldError(field, "a conversation with a message of yours", "none yet")
        return users

    async def _do_regen(self, command: Command) -> None:
        last = self._user_messages("/regen")[-1]
        greedy = " (--temperature 0: the same reply)" if self.settings.get("temperature") == 0 else ""
        self.term.note(f"answering your last message again, with a new seed{greedy}; the old reply leaves {self.name}")
        await self._ask(self.messages[:last + 1], self.name, seed=None)

    async def _do_edit(self, command: Command) -> None:
        users = self._user_messages("/edit")
        number = command.number or len(users)
        if number > len(users):
            raise FieldError("/edit", f"a message number in [1, {len(users)}]", number)
        index = users[number - 1]
        try:
            text = command.text or self.term.read_line("edit> ", self.messages[index].content)
        except (EOFError, KeyboardInterrupt):  # Ctrl-D or Ctrl-C at the edit prompt
            text = ""
            self.term.newline()
        if not text.strip():
            return self.term.note("nothing sent: the edit was cancelled or is empty")
        self.term.note(f"your message {number} edited: a new conversation forks here ({self.name} stays as it was)")
        await self._ask([*self.messages[:index], Message("user", text)], None)

    async def _do_system(self, command: Command) -> None:
        if not command.text:
            system = self.messages[0].content if self.messages and self.messages[0].role == "system" else None
            return self.term.note("no system prompt: the model's default" if system is None else f"system: {system}")
        self.system = command.text
        started = any(m.role == "user" for m in self.messages)
        if started:
            self.term.note(f"a new conversation with this system prompt ({self.name} stays as it was)")
        self._begin(None if started else self.name)
