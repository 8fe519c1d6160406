"""Every dashboard tab, driven headless with Textual's pilot against a real server on a tiny
random Llama (uvicorn on loopback, the chat tab talking HTTP), asserting the rendered text."""

from __future__ import annotations

import asyncio
import json

import httpx
from loguru import logger
from tui_testlib import screen_text, wait_for

from metrale_core.tui.app import MetraleApp
from metrale_core.tui.chat_client import ChatClient
from metrale_core.tui.logring import LogRing
from metrale_core.tui.status import ServerStatus

SIZE = (130, 44)


def _direct_answer(url: str, text: str, max_tokens: int) -> str:
    body = {
        "model": "tiny-llama",
        "messages": [{"role": "user", "content": text}],
        "max_tokens": max_tokens,
        "temperature": 0.0,
    }
    reply = httpx.post(url + "/v1/chat/completions", json=body, timeout=60).json()
    return reply["choices"][0]["message"]["content"]


def test_overview_stats_chat_and_quit_against_a_live_server(served):
    status, server = served

    async def scenario():
        app = MetraleApp(status, LogRing(), refresh_s=0.1, chat_max_tokens=12)
        async with app.run_test(size=SIZE) as pilot:
            await wait_for(pilot, lambda: "SERVING" in screen_text(app), what="SERVING pill")
            text = screen_text(app)
            header = text.splitlines()[0]
            assert "M E T R A L E" in header and "SERVING" in header and "up 0:00:0" in header
            assert f"listen {status.listen}" in header and "model tiny-llama" in header
            assert "kv float32" in header and "sched fcfs" in header
            assert "READY" in text and f"listening {status.listen}" in text
            for phase in ("HTTP server", "weights", "engine"):
                assert f"✓ {phase}" in text
            assert "tensors 20/20" in text and "100.0%" in text

            # chat: a streamed answer over HTTP, the same text a plain API call returns
            await pilot.press("4")
            await pilot.press(*"hello world")
            await pilot.press("enter")
            chat = app.query_one("ChatPane")
            await wait_for(pilot, lambda: len(chat.history) == 2, what="the chat answer")
            answer = chat.history[1]["content"]
            expected = await asyncio.to_thread(_direct_answer, server.url, "hello world", chat.max_tokens)
            assert answer == expected and answer.strip()
            text = screen_text(app)
            assert "you hello world" in text
            assert "assistant " + answer.strip().split()[0] in text

            # stats: both requests are counted, tokens and a TTFT were recorded
            await pilot.press("escape", "2")
            await pilot.pause(0.3)
            text = screen_text(app)
            snap = status.snapshot()
            assert snap.requests_total == 2 and snap.requests_finished == 2
            assert "total 2  active 0  waiting 0" in text
            assert f"{snap.generation_tokens_total} generated" in text
            assert "p50 —" not in text and "n=2" in text
            assert "KV blocks used 0 / free 128 of 128" in text
            assert "prefix-cache hit rate" in text and "preemptions 0" in text

            # quitting stops the server
            await pilot.press("q")
        server.thread.join(15)
        assert not server.thread.is_alive()
        assert status.state == "stopping"

    asyncio.run(scenario())


def test_plugin_extras_show_on_the_stats_tab(served):
    status, _ = served
    publisher = status.engine.snapshots
    # a provider, so it replaces the one the installed metrale-b1 attaches (metrale_engine_started)
    publisher.add_extras_provider("b1_count", lambda: 3)
    # each extra carries the label / formatter its plugin declares (the pane knows no names)
    publisher.set_extra("fp8_scale_source", "checkpoint", label="FP8 scale source")
    publisher.add_extras_provider(
        "speculative",
        lambda: {"acceptance_rate": 0.75},
        label="speculative",
        format=lambda v: f"acceptance {100 * v['acceptance_rate']:.1f}%",
    )
    httpx.post(
        f"{status.base_url}/v1/completions",
        json={"model": "tiny-llama", "prompt": "the cat", "max_tokens": 2},
        timeout=60,
    )

    async def scenario():
        app = MetraleApp(status, refresh_s=0.1)
        async with app.run_test(size=SIZE) as pilot:
            await pilot.press("2")
            await pilot.pause(0.2)
            text = screen_text(app)
            assert "B1 count: 3" in text
            assert "FP8 scale source: checkpoint" in text
            assert "speculative: acceptance 75.0%" in text

    asyncio.run(scenario())


def test_logs_tab_follows_pauses_and_filters():
    ring = LogRing(capacity=50)
    handler = logger.add(ring.sink, level="INFO", format="{message}")
    try:

        async def scenario():
            app = MetraleApp(ServerStatus(state="no_model"), ring, refresh_s=0.05)
            async with app.run_test(size=SIZE) as pilot:
                assert "NO MODEL" in screen_text(app).splitlines()[0]
                await pilot.press("3")
                logger.info("engine warmed up")
                logger.warning("kv cache nearly full")
                await pilot.pause(0.2)
                text = screen_text(app)
                assert "INFO    engine warmed up" in text and "WARNING kv cache nearly full" in text
                assert "● following" in text

                await pilot.press("f")
                logger.info("arrives while paused")
                await pilot.pause(0.2)
                text = screen_text(app)
                assert "paused (1 new)" in text and "arrives while paused" not in text
                await pilot.press("f")
                await pilot.pause(0.2)
                assert "arrives while paused" in screen_text(app)

                await pilot.press("slash", *"WARN")
                await pilot.pause(0.2)
                text = screen_text(app)
                assert "kv cache nearly full" in text and "engine warmed up" not in text
                await pilot.press("escape", "q")

        asyncio.run(scenario())
    finally:
        logger.remove(handler)


def _sse(*chunks) -> bytes:
    events = [f"data: {json.dumps({'choices': [{'index': 0, 'delta': d, 'finish_reason': f}]})}\n\n" for d, f in chunks]
    return ("".join(events) + "data: [DONE]\n\n").encode()


def test_chat_shows_reasoning_apart_from_the_answer():
    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content))
        body = _sse(
            ({"role": "assistant", "content": ""}, None),
            ({"reasoning_content": "Two and two "}, None),
            ({"reasoning_content": "make four."}, None),
            ({"content": "The answer"}, None),
            ({"content": " is 4."}, None),
            ({}, "stop"),
        )
        return httpx.Response(200, content=body, headers={"content-type": "text/event-stream"})

    status = ServerStatus(model="scripted", listen="127.0.0.1:9")
    status.set_serving()
    factory = lambda s: ChatClient(s.base_url, s.model, transport=httpx.MockTransport(handler))

    async def scenario():
        app = MetraleApp(status, chat_client_factory=factory, refresh_s=0.1)
        async with app.run_test(size=SIZE) as pilot:
            await pilot.press("4", *"ponder 2+2", "enter")
            chat = app.query_one("ChatPane")
            await wait_for(pilot, lambda: len(chat.history) == 2, what="the scripted answer")
            lines = screen_text(app).splitlines()
            think = next(i for i, line in enumerate(lines) if "│ thinking" in line)
            assert "Two and two make four." in lines[think + 1]
            assert "assistant The answer is 4." in lines[think + 2]
            assert chat.history[1] == {"role": "assistant", "content": "The answer is 4."}
            await pilot.press("escape", "q")

    asyncio.run(scenario())
    assert seen[0]["stream"] is True and seen[0]["messages"][-1]["content"] == "ponder 2+2"


def test_help_tab_and_loading_progress():
    status = ServerStatus(model="big-model")
    status.plan_phases("HTTP server", "weights", "engine")
    status.end_phase("HTTP server")
    status.begin_phase("weights")
    status.start_load(checkpoint_bytes=2_000_000_000)
    status.tensor_loaded(50, 200, 400_000_000)

    async def scenario():
        app = MetraleApp(status, refresh_s=0.1)
        async with app.run_test(size=SIZE) as pilot:
            text = screen_text(app)
            assert "LOADING" in text.splitlines()[0]
            assert "✓ HTTP server" in text and "○ engine" in text
            assert "tensors 50/200" in text and "25.0%" in text and "ETA" in text
            assert "checkpoint 2.0 GB" in text and "read 400.0 MB" in text
            await pilot.press("2")
            await pilot.pause(0.1)
            assert "no engine yet" in screen_text(app)
            await pilot.press("question_mark")
            await pilot.pause(0.1)
            text = screen_text(app)
            assert "Metrale dashboard — keys" in text and "quit: stop the server and exit" in text
            await pilot.press("q")
        assert status.stop_requested and status.state == "stopping"

    asyncio.run(scenario())


def test_a_refresh_tick_without_the_dashboard_widgets_does_nothing(served):
    """The refresh interval can fire once more while the app shuts down, when the dashboard's
    widgets are gone: that tick must not raise (it failed a run under load once)."""
    from metrale_core.tui.header import HeaderBar

    status, _ = served

    async def scenario():
        app = MetraleApp(status, refresh_s=60)
        async with app.run_test(size=SIZE) as pilot:
            ticks = app.tick
            app.refresh_now()
            assert app.tick == ticks + 1
            await app.query_one(HeaderBar).remove()  # as in teardown
            await pilot.pause(0.05)
            app.refresh_now()
            assert app.tick == ticks + 1

    asyncio.run(scenario())
