"""The chat page at ``/`` in headless Chromium (Playwright) against real uvicorn on loopback.

The server runs a scripted model whose steps pass a :class:`Gate` the test holds: while the gate
is paced each engine forward (one token) needs a permit, so "partial text is on the page before
the final text" and "Stop mid-stream" are decided by the test, never by timing.  A screenshot of
every state goes to a ``tmp_path`` folder (its path is printed) and, when ``METRALE_SCREENSHOT_DIR``
is set, there too.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from server_testlib import API_KEY, SCRIPTED_ENGINE, ScriptedLM

from metrale_core.testing.requires import missing

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
DEADLINE_MS = 30_000
COUNT = "one two three four five six seven eight nine ten"
MARKDOWN_REPLY = (
    "## Result\n\nSome **bold**, *italic* and `inline code`.\n\n"
    "- first\n- second\n\n```python\nprint('hi')\n```\n\nSee [the docs](https://example.com/_b_/)."
)
XSS_REPLY = (
    '<img src=x onerror="window.__pwned=1"> [click](javascript:window.__pwned=2) <script>window.__pwned=3</script>'
)
WEATHER_TOOL = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]


class Gate:
    """Paces engine forwards: open, every forward runs; paced, each needs one :meth:`allow`."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._paced = False
        self._permits = 0

    def pace(self) -> None:
        with self._cond:
            self._paced, self._permits = True, 0

    def allow(self, n: int) -> None:
        with self._cond:
            self._permits += n
            self._cond.notify_all()

    def open(self) -> None:
        with self._cond:
            self._paced = False
            self._cond.notify_all()

    def pass_through(self) -> None:
        with self._cond:
            if not self._cond.wait_for(lambda: not self._paced or self._permits > 0, timeout=120):
                raise RuntimeError("the test never opened the gate")
            if self._paced:
                self._permits -= 1


class GatedLM(ScriptedLM):
    """The scripted model behind a :class:`Gate`, with two more scripts for the page's renderer."""

    EXTRA = (("markdown", MARKDOWN_REPLY), ("xss", XSS_REPLY))

    def __init__(self, tokenizer, gate: Gate):
        super().__init__(tokenizer)
        self.gate = gate

    def forward(self, batch, kv, state=None):
        self.gate.pass_through()
        return super().forward(batch, kv, state)

    def _reply(self, prompt):
        last_user = self.tokenizer.decode(prompt, skip_special_tokens=False).rsplit("<|im_start|>user\n", 1)[-1]
        for keyword, reply in self.EXTRA:
            if keyword in last_user:
                return self.tokenizer.encode(reply, add_special_tokens=False)
        return super()._reply(prompt)


@pytest.fixture(scope="module")
def gate():
    gate = Gate()
    yield gate
    gate.open()


@pytest.fixture(scope="module")
def gated(start_server, byte_tokenizer, gate):
    """``(server, host)`` serving :class:`GatedLM` (no API key), every delta sent at once."""
    from metrale_core.engine import EngineConfig, LLMEngine
    from metrale_core.plugin.discovery import load_registry
    from metrale_core.server import ServedModel

    options: dict[str, Any] = dict(SCRIPTED_ENGINE)

    def load():
        registry = load_registry()
        engine = LLMEngine(
            GatedLM(byte_tokenizer, gate), EngineConfig(**options), tokenizer=byte_tokenizer, registry=registry
        )
        return ServedModel(engine=engine, tokenizer=byte_tokenizer, model_type="qwen3")

    # unpaced streams: a paced bridge holds deltas until a later step, which the gate may hold back
    return start_server(loader=load, stream_interval_ms=0.0)


@pytest.fixture(scope="module")
def browser():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        missing("playwright is not installed (pip install playwright; no browser download needed)")
    if not CHROMIUM.is_file():
        missing(f"{CHROMIUM} is absent (apt-get install chromium)")
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture(scope="module")
def shots(tmp_path_factory, request):
    """``shots(page, name)`` saves a screenshot (see the module docstring); the folder's path is
    written to the terminal at the end (also without ``-s``)."""
    folder = tmp_path_factory.mktemp("webui-screenshots")
    extra = os.environ.get("METRALE_SCREENSHOT_DIR")
    where = f"web UI screenshots: {folder}" + (f" and {extra}" if extra else "")
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if capture is None:
        print(where)
    else:
        with capture.global_and_fixture_disabled():
            print(f"\n{where}")

    def shoot(page, name: str) -> Path:
        path = folder / f"webui-{name}.png"
        page.screenshot(path=str(path), full_page=True)
        if extra:
            Path(extra).mkdir(parents=True, exist_ok=True)
            shutil.copy(path, Path(extra) / path.name)
        return path

    return shoot


@pytest.fixture
def page(browser):
    """A fresh browser context (empty localStorage) and page; console errors in ``page.errors``."""
    context = browser.new_context(viewport={"width": 1100, "height": 800})
    page = context.new_page()
    page.errors = []
    page.on("console", lambda m: m.type == "error" and page.errors.append(m.text))
    page.on("pageerror", lambda e: page.errors.append(str(e)))
    page.set_default_timeout(DEADLINE_MS)
    yield page
    context.close()


def _open(page, url: str) -> None:
    page.goto(url + "/")
    page.wait_for_selector("#model option[value=scripted]", state="attached")


def _send(page, text: str) -> None:
    page.fill("#prompt", text)
    page.press("#prompt", "Enter")


def _answer(page):
    return page.locator(".msg.assistant .answer").last


def _wait_idle(page) -> None:
    page.wait_for_selector("body[data-state=idle]", state="attached")


def _ask(page, text: str):
    """Send ``text``, wait until the page is idle again; return the last answer's locator."""
    _send(page, text)
    _wait_idle(page)
    return _answer(page)


def _wait_answer(page, text: str) -> None:
    page.wait_for_function(
        "t => [...document.querySelectorAll('.msg.assistant .answer')].pop()?.textContent.trim() === t", arg=text
    )


def _metric(url: str, name: str, **labels: str) -> float:
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def _poll(condition, what: str, seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def test_page_is_served_with_security_headers(gated):
    url = gated[0].url
    response = httpx.get(url + "/")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")
    csp = response.headers["content-security-policy"]
    assert "default-src 'self'" in csp and "connect-src 'self'" in csp
    assert response.headers["x-content-type-options"] == "nosniff"
    assert '<textarea id="prompt"' in response.text
    assert not re.search(r"""(src|href)=["']https?://""", response.text), "the page must load nothing external"
    paths = httpx.get(url + "/schema/openapi.json").json()["paths"]
    assert "/" not in paths and "/v1/chat/completions" in paths


def test_streams_tokens_and_shows_speed_and_context(page, gated, gate, shots):
    url = gated[0].url
    _open(page, url)
    shots(page, "empty")
    gate.pace()
    try:
        _send(page, "please count to ten")
        gate.allow(6)  # the prefill and five decode steps: six tokens, then the engine waits
        page.wait_for_function("() => document.querySelector('.msg.assistant .answer')?.textContent.includes('one')")
        partial = _answer(page).text_content().strip()
        assert page.locator("body").get_attribute("data-state") == "streaming"
        assert partial and partial != COUNT and COUNT.startswith(partial)
        shots(page, "streaming")
    finally:
        gate.open()
    _wait_answer(page, COUNT)
    _wait_idle(page)
    max_len = httpx.get(url + "/v1/models").json()["data"][0]["max_model_len"]
    assert re.fullmatch(r"[\d.]+ tok/s", page.text_content("#speed"))
    context = page.text_content("#context")
    match = re.fullmatch(rf"context: (\d+) / {max_len} tokens \(\d+%\)", context)
    assert match and int(match.group(1)) > len(COUNT), context
    assert page.locator(".msg.user .bubble").text_content() == "please count to ten"
    shots(page, "answered")
    assert page.errors == []


def test_markdown_reasoning_and_tool_calls(page, gated, shots):
    _open(page, gated[0].url)
    answer = _ask(page, "show me markdown")
    assert answer.locator("h2").text_content() == "Result"
    assert answer.locator("strong").text_content() == "bold"
    assert answer.locator("em").text_content() == "italic"
    assert answer.locator("p code").text_content() == "inline code"
    assert answer.locator("ul li").all_text_contents() == ["first", "second"]
    assert answer.locator(".codeblock .lang").text_content() == "python"
    assert answer.locator(".codeblock code").text_content() == "print('hi')"
    assert answer.locator(".codeblock button.copy").count() == 1
    assert answer.locator("a").get_attribute("href") == "https://example.com/_b_/"
    page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    answer.locator(".codeblock button.copy").click()
    page.wait_for_function("() => document.querySelector('.codeblock button.copy').textContent === 'Copied'")
    assert page.evaluate("() => navigator.clipboard.readText()") == "print('hi')"
    shots(page, "markdown")

    _send(page, "ponder this: what is two and two?")
    _wait_answer(page, "The answer is 4.")
    _wait_idle(page)
    reasoning = page.locator(".msg.assistant details.reasoning").last
    assert reasoning.is_visible() and reasoning.get_attribute("open") is None  # folded
    assert "Two and two make four." in reasoning.locator(".content").text_content()
    shots(page, "reasoning-folded")
    reasoning.locator("summary").click()
    assert reasoning.get_attribute("open") is not None
    shots(page, "reasoning-open")

    page.click("#settings-toggle")
    page.fill("#tools", json.dumps(WEATHER_TOOL))
    _send(page, "what is the weather in Paris?")
    _wait_idle(page)
    card = page.locator(".msg.assistant .tool-call").last
    assert card.locator(".tool-name").text_content() == "Tool call: get_weather"
    assert json.loads(card.locator(".tool-args").text_content()) == {"city": "Paris"}
    assert "finish: tool_calls" in page.locator(".msg.assistant .meta").last.text_content()
    shots(page, "tool-call")
    assert page.errors == []


def test_html_in_messages_renders_as_text(page, gated, shots):
    _open(page, gated[0].url)
    answer = _ask(page, 'xss <b id="injected">bold?</b><img src=x onerror="window.__pwned=4">')
    assert "<img src=x onerror=" in answer.text_content() and "<script>" in answer.text_content()
    assert "[click](javascript:window.__pwned=2)" in answer.text_content()
    assert page.locator(".msg img, .msg script, #injected, .msg a[href^='javascript']").count() == 0
    assert '<b id="injected">' in page.locator(".msg.user .bubble").text_content()
    assert page.evaluate("() => window.__pwned") is None
    shots(page, "xss-as-text")


def test_stop_aborts_the_request_and_keeps_the_partial_answer(page, gated, gate, shots):
    server, host = gated
    engine = host.served.engine
    aborted_before = _metric(server.url, "metrale:request_success_total", finished_reason="abort")
    _open(page, server.url)
    gate.pace()
    try:
        _send(page, "count slowly")
        gate.allow(8)  # exactly eight tokens can be generated: "one two "
        _wait_answer(page, "one two")
        shots(page, "before-stop")
        page.click("#stop")
        _wait_idle(page)
        # the server saw the client go while the engine still waits at the gate
        _poll(
            lambda: _metric(server.url, "metrale:request_success_total", finished_reason="abort") == aborted_before + 1,
            "the server to record the abort",
        )
    finally:
        gate.open()
    _poll(
        lambda: (s := engine.stats()).num_running == 0 and s.num_waiting == 0 and host.in_flight == 0,
        "the engine to drop the request",
    )
    assert _answer(page).text_content().strip() == "one two"
    assert "stopped" in page.locator(".msg.assistant .meta").last.text_content()
    assert page.locator("#send").is_visible() and not page.locator("#stop").is_visible()
    shots(page, "stopped")


def test_reload_keeps_the_conversation_and_new_chat_clears_it(page, gated, shots):
    _open(page, gated[0].url)
    _send(page, "What is the capital of France?")
    _wait_answer(page, "The capital of France is Paris.")
    _wait_idle(page)
    page.reload()
    page.wait_for_selector(".msg.assistant .answer")
    assert page.locator(".msg.user .bubble").all_text_contents() == ["What is the capital of France?"]
    assert _answer(page).text_content().strip() == "The capital of France is Paris."
    shots(page, "reloaded")
    page.click("#new-chat")
    assert page.locator(".msg").count() == 0
    page.reload()
    page.wait_for_selector("#messages .empty")
    assert page.locator(".msg").count() == 0


def test_api_key_asked_for_then_used(page, start_server, shots):
    server, _ = start_server(api_key=API_KEY)
    page.goto(server.url + "/")
    page.wait_for_function("() => document.querySelector('#notice').textContent.includes('API key')")
    assert page.locator("#settings").is_visible()
    _send(page, "What is the capital of France?")
    _wait_idle(page)
    assert "needs an API key" in page.locator(".msg.assistant .error").text_content()
    shots(page, "api-key-needed")

    page.fill("#api-key", API_KEY)
    page.press("#api-key", "Tab")  # change: the models are fetched again with the key
    page.wait_for_selector("#model option[value=scripted]", state="attached")
    assert page.text_content("#notice") == ""
    _send(page, "What is the capital of France?")
    _wait_answer(page, "The capital of France is Paris.")
    shots(page, "api-key-works")
    stored = page.evaluate("() => JSON.parse(localStorage.getItem('metrale.settings'))")
    assert stored["api-key"] == API_KEY


def test_phone_width_and_dark_scheme(browser, gated, shots):
    context = browser.new_context(viewport={"width": 390, "height": 760}, is_mobile=True, color_scheme="dark")
    try:
        page = context.new_page()
        _open(page, gated[0].url)
        _send(page, "What is the capital of France?")
        _wait_answer(page, "The capital of France is Paris.")
        width = page.evaluate("() => document.documentElement.scrollWidth")
        assert width <= 390, f"the page scrolls sideways at phone width ({width}px)"
        header = page.locator("header").bounding_box()
        assert header is not None and header["height"] < 60, "the header wraps at phone width"
        assert page.evaluate("() => getComputedStyle(document.body).backgroundColor") == "rgb(23, 24, 27)"  # dark
        shots(page, "phone-dark")
        page.click("#settings-toggle")
        assert page.locator("#settings").is_visible()
        shots(page, "phone-settings")
    finally:
        context.close()
