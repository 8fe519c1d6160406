"""``met chat``: a terminal chat with a running ``met serve`` (or any OpenAI-compatible server).

Owner: the CLI.  Speaks HTTP only (``/v1/models``, ``/v1/chat/completions`` with
``stream: true``); it never loads a model itself.

Invariants:
- stdout carries only the assistant's replies (streamed as they arrive, one newline after each);
  prompts, reasoning and errors go to stderr.
- The conversation is kept client-side; ``/reset`` clears it, ``/exit`` (or end of input) quits.
- A server error (an OpenAI-shaped body, or an error event mid-stream) is printed as one line
  and the chat goes on; an unreachable server is an error with exit code 2.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterator
from typing import Any

from metrale_core.errors import MetraleError

__all__ = ["ChatClient", "add_parser", "run"]


class ChatError(MetraleError):
    """The server could not be reached or answered with an error."""


def add_parser(sub, registry=None) -> argparse.ArgumentParser:
    cmd = sub.add_parser(
        "chat",
        help="chat with a running met serve from the terminal",
        description="Chat with a running server over HTTP (streaming). Each "
        "input line is a user message; /reset clears the "
        "conversation, /exit quits.",
    )
    cmd.add_argument(
        "--url",
        default=os.environ.get("METRALE_URL", "http://127.0.0.1:8000"),
        help="server base URL (default: $METRALE_URL or http://127.0.0.1:8000)",
    )
    cmd.add_argument("--model", default=None, help="model name (default: the server's first)")
    cmd.add_argument(
        "--api-key", default=os.environ.get("METRALE_API_KEY"), help="bearer key (default: $METRALE_API_KEY)"
    )
    cmd.add_argument("--system", default=None, help="system message")
    cmd.add_argument(
        "--message",
        "-p",
        action="append",
        default=None,
        metavar="TEXT",
        help="send TEXT, print the reply and exit (repeatable: one turn each)",
    )
    cmd.add_argument("--max-tokens", type=int, default=512)
    cmd.add_argument("--temperature", type=float, default=0.7)
    cmd.add_argument("--seed", type=int, default=None)
    cmd.set_defaults(func=run)
    return cmd


class ChatClient:
    """A streaming chat over HTTP that keeps the conversation."""

    def __init__(
        self, url: str, model: str | None = None, api_key: str | None = None, system: str | None = None, **sampling: Any
    ) -> None:
        import httpx

        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = httpx.Client(base_url=url.rstrip("/"), headers=headers, timeout=600)
        self.system = system
        self.sampling = {k: v for k, v in sampling.items() if v is not None}
        self.model = model or self._first_model()
        self.messages: list[dict[str, Any]] = []
        self.reset()

    def reset(self) -> None:
        self.messages = [{"role": "system", "content": self.system}] if self.system else []

    def _first_model(self) -> str:
        import httpx

        try:
            resp = self.http.get("/v1/models")
        except httpx.HTTPError as exc:
            raise ChatError(f"cannot reach {self.http.base_url}: {exc}") from None
        if resp.status_code != 200:
            raise ChatError(_error_text(resp.status_code, resp.text))
        data = resp.json().get("data") or []
        if not data:
            raise ChatError(f"{self.http.base_url} serves no model")
        return data[0]["id"]

    def send(self, text: str) -> Iterator[tuple[str, str]]:
        """Stream the reply to ``text`` as ``(kind, piece)``: content, reasoning or tool."""
        import httpx

        self.messages.append({"role": "user", "content": text})
        body = {"model": self.model, "messages": self.messages, "stream": True, **self.sampling}
        reply: list[str] = []
        try:
            with self.http.stream("POST", "/v1/chat/completions", json=body) as resp:
                if resp.status_code != 200:
                    self.messages.pop()
                    raise ChatError(_error_text(resp.status_code, resp.read().decode()))
                for kind, piece in _events(resp.iter_lines()):
                    if kind == "content":
                        reply.append(piece)
                    yield kind, piece
        except httpx.HTTPError as exc:
            self.messages.pop()
            raise ChatError(f"connection to {self.http.base_url} failed: {exc}") from None
        self.messages.append({"role": "assistant", "content": "".join(reply)})


def _error_text(status: int, text: str) -> str:
    try:
        return f"HTTP {status}: {json.loads(text)['error']['message']}"
    except (ValueError, KeyError, TypeError):
        return f"HTTP {status}: {text[:200]}"


def _events(lines: Iterator[str]) -> Iterator[tuple[str, str]]:
    for line in lines:
        if not line.startswith("data: "):
            continue
        data = line[6:]
        if data == "[DONE]":
            return
        event = json.loads(data)
        if "error" in event:
            raise ChatError(event["error"].get("message", "stream failed"))
        for choice in event.get("choices") or []:
            delta = choice.get("delta") or {}
            if delta.get("reasoning_content"):
                yield "reasoning", delta["reasoning_content"]
            if delta.get("content"):
                yield "content", delta["content"]
            for call in delta.get("tool_calls") or []:
                fn = call.get("function") or {}
                yield "tool", (fn.get("name") or "") + (fn.get("arguments") or "")


def _turn(client: ChatClient, text: str) -> None:
    out, err = sys.stdout, sys.stderr
    for kind, piece in client.send(text):
        stream = out if kind == "content" else err
        stream.write(piece)
        stream.flush()
    out.write("\n")
    out.flush()


def run(args, registry=None) -> int:
    client = ChatClient(
        args.url,
        args.model,
        args.api_key,
        args.system,
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        seed=args.seed,
    )
    if args.message:
        for text in args.message:
            _turn(client, text)
        return 0
    interactive = sys.stdin.isatty()
    if interactive:
        print(f"chatting with {client.model} at {args.url} (/reset, /exit)", file=sys.stderr)
    while True:
        if interactive:
            print("> ", end="", file=sys.stderr, flush=True)
        line = sys.stdin.readline()
        if not line or line.strip() == "/exit":
            return 0
        text = line.strip()
        if not text:
            continue
        if text == "/reset":
            client.reset()
            continue
        try:
            _turn(client, text)
        except ChatError as exc:
            if not interactive:
                raise
            print(f"error: {exc}", file=sys.stderr)
