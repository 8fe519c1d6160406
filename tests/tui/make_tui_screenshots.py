"""Write docs/screenshots/tui-*.svg: Textual's export of each dashboard tab, with the real
SmolLM2 served over HTTP (loopback) and one chat round trip.

Run: python tests/tui/make_tui_screenshots.py
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import httpx
from loguru import logger

sys.path.insert(0, str(Path(__file__).parent))
from tui_testlib import wait_for

ROOT = Path(__file__).resolve().parents[2]
SMOL = Path.home() / ".cache/metrale/models/SmolLM2-135M-Instruct.Q4_1.gguf"


def main() -> None:
    from metrale_core.plugin.discovery import load_registry
    from metrale_core.server import ServerConfig, create_app, serve_in_thread
    from metrale_core.tui.app import MetraleApp
    from metrale_core.tui.launch import PHASES, follow_host, observe_loader
    from metrale_core.tui.logring import LogRing
    from metrale_core.tui.status import ServerStatus

    out = ROOT / "docs" / "screenshots"
    out.mkdir(parents=True, exist_ok=True)
    logs = LogRing()
    logger.remove()
    logger.add(logs.sink, level="INFO", format="{message}")
    registry = load_registry()
    status = ServerStatus(version="0.1.0", model="SmolLM2-135M-Instruct", scheduler="fcfs")
    status.plan_phases(*PHASES)

    def load():
        from metrale_core.engine import EngineConfig, LLMEngine
        from metrale_core.loading.load import load_model
        from metrale_core.server import ServedModel

        loaded = load_model(SMOL, registry=registry, progress=False, on_tensor=status.tensor_loaded)
        engine = LLMEngine(
            loaded.model,
            EngineConfig(num_kv_blocks=256, max_model_len=2048),
            tokenizer=loaded.tokenizer,
            registry=registry,
        )
        return ServedModel(engine=engine, tokenizer=loaded.tokenizer, model_type="llama")

    loader = observe_loader(status, load)
    app_server = create_app(ServerConfig(served_model_name="SmolLM2-135M-Instruct"), loader, registry)
    with status.phase("HTTP server"):
        server = serve_in_thread(app_server)
    status.listen = f"{server.host}:{server.port}"
    status.end_phase("HTTP server", detail=status.listen)
    follow_host(status, app_server.state.host)
    while httpx.get(server.url + "/health").status_code != 200:
        time.sleep(0.1)
        status.poll()
    status.poll()
    for prompt in ("Say hello.", "Name a colour.", "Count to five."):
        httpx.post(
            server.url + "/v1/chat/completions",
            timeout=120,
            json={"messages": [{"role": "user", "content": prompt}], "max_tokens": 24},
        )

    async def shoot() -> None:
        app = MetraleApp(status, logs, refresh_s=0.25)
        async with app.run_test(size=(130, 40)) as pilot:
            await pilot.pause(1.0)
            app.save_screenshot(str(out / "tui-overview.svg"))
            await pilot.press("4", *"What is the capital of France?", "enter")
            chat = app.query_one("ChatPane")
            await wait_for(pilot, lambda: len(chat.history) == 2, timeout=120)
            app.save_screenshot(str(out / "tui-chat.svg"))
            for key, name in (("escape", None), ("2", "stats"), ("3", "logs"), ("5", "help")):
                await pilot.press(key)
                await pilot.pause(0.6)
                if name:
                    app.save_screenshot(str(out / f"tui-{name}.svg"))

    asyncio.run(shoot())
    server.stop()
    print("\n".join(sorted(str(p.relative_to(ROOT)) for p in out.glob("tui-*.svg"))))


if __name__ == "__main__":
    main()
