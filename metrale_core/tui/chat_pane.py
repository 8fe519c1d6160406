"""``ChatPane``: a streaming chat client inside the dashboard, with reasoning shown apart.

Owner: the dashboard app (tab 4).  Sends the conversation to the running server through
:class:`ChatClient` (its HTTP API), one request at a time, in a Textual worker so the UI never
waits on the network.

Invariants:
- Each assistant turn shows its reasoning (dim, under "thinking") apart from its answer; only
  the answer goes back into the conversation history.
- While the server is not serving, a message is refused with a note (nothing is sent).
- A failed request shows its error in the transcript and keeps the history as it was.
"""

from __future__ import annotations

from collections.abc import Callable

from rich.text import Text
from textual.containers import Vertical, VerticalScroll
from textual.widgets import Input, Static

from metrale_core.tui.chat_client import ChatClient, ChatError
from metrale_core.tui.status import ServerStatus

__all__ = ["ChatPane", "assistant_text"]


def assistant_text(reasoning: str, answer: str, error: str | None = None, done: bool = False) -> Text:
    text = Text()
    if reasoning:
        text.append("thinking\n", style="bold dim")
        text.append(reasoning.strip() + "\n", style="dim italic")
    text.append("assistant ", style="bold green")
    answer = answer.lstrip()  # models often open with a space or a newline
    text.append(answer if answer or done else "…")
    if error:
        text.append(f"\nerror: {error}", style="bold red")
    return text


class ChatPane(Vertical):
    DEFAULT_CSS = """
    ChatPane #chat-log { height: 1fr; border: round $primary-darken-2; padding: 0 1; }
    ChatPane #chat-log > Static { margin: 0 0 1 0; }
    ChatPane #chat-input { dock: bottom; }
    """

    def __init__(
        self,
        status: ServerStatus,
        client_factory: Callable[[ServerStatus], ChatClient] | None = None,
        max_tokens: int | None = None,
        **kwargs,
    ) -> None:
        super().__init__(**kwargs)
        self.status = status
        # called only while serving, when base_url is set (see on_input_submitted)
        self.client_factory = client_factory or (lambda s: ChatClient(s.base_url or "", model=s.model))
        self.max_tokens = max_tokens
        self.history: list[dict[str, str]] = []
        self.busy = False

    def compose(self):
        yield VerticalScroll(
            Static(
                Text("Type a message and press Enter. The chat talks to the server over its HTTP API.", style="dim")
            ),
            id="chat-log",
        )
        yield Input(placeholder="message (Enter to send)", id="chat-input")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.input.id != "chat-input":
            return
        event.stop()
        message = event.value.strip()
        if not message:
            return
        log = self.query_one("#chat-log", VerticalScroll)
        if self.busy:
            log.mount(Static(Text("still answering the last message…", style="yellow")))
            return
        if self.status.state != "serving" or not self.status.base_url:
            log.mount(
                Static(
                    Text(
                        f"the server is not serving yet ({self.status.pill}); try again when the pill says SERVING",
                        style="yellow",
                    )
                )
            )
            return
        event.input.value = ""
        user = Text("you ", style="bold cyan")
        user.append(message)
        log.mount(Static(user, classes="user"))
        reply = Static(assistant_text("", ""), classes="assistant")
        log.mount(reply)
        log.scroll_end(animate=False)
        self.busy = True
        self.run_worker(self._converse(message, reply), exclusive=True, group="chat")

    async def _converse(self, message: str, reply: Static) -> None:
        messages = self.history + [{"role": "user", "content": message}]
        reasoning, answer, error = "", "", None
        log = self.query_one("#chat-log", VerticalScroll)
        try:
            client = self.client_factory(self.status)
            async for delta in client.stream(messages, max_tokens=self.max_tokens):
                reasoning += delta.reasoning
                answer += delta.content
                reply.update(assistant_text(reasoning, answer))
                log.scroll_end(animate=False)
        except ChatError as exc:
            error = str(exc)
        finally:
            self.busy = False
        reply.update(assistant_text(reasoning, answer, error, done=True))
        log.scroll_end(animate=False)
        if error is None:
            self.history = messages + [{"role": "assistant", "content": answer}]
