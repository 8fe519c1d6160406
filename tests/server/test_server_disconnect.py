"""16 concurrent streams, 4 clients disconnect midway: the others complete, the 4 are aborted
while the rest still run, and no KV block is leaked (engine and /metrics back to idle)."""

from __future__ import annotations

import asyncio
import re
import time

import httpx
import openai


def _metric(text: str, name: str, **labels) -> float:
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_disconnects_abort_and_free_blocks(start_server):
    server, host = start_server()
    url = server.url
    engine = host.served.engine
    aborted_before = _metric(httpx.get(url + "/metrics").text, "metrale:request_success_total", finished_reason="abort")

    async def run() -> tuple[list, float]:
        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=120)
        aborts_seen_while_running = asyncio.Event()

        async def watch_aborts() -> None:
            async with httpx.AsyncClient() as http:
                while True:
                    text = (await http.get(url + "/metrics")).text
                    aborted = _metric(text, "metrale:request_success_total", finished_reason="abort") - aborted_before
                    running = _metric(text, "metrale:num_requests_running")
                    if aborted == 4 and running > 0:
                        aborts_seen_while_running.set()
                        return
                    await asyncio.sleep(0.01)

        async def one(i: int) -> tuple[int, str, str | None]:
            leaver = i % 4 == 0
            stream = await client.completions.create(
                model="scripted",
                prompt=f"prompt number {i}",
                max_tokens=400,
                temperature=0,
                stream=True,
                extra_body={"ignore_eos": True},
            )
            text, finish, n = "", None, 0
            async for chunk in stream:
                text += chunk.choices[0].text
                finish = chunk.choices[0].finish_reason or finish
                n += 1
                if leaver and n == 5:
                    await stream.close()
                    return i, text, "client-closed"
                if not leaver and n % 20 == 0:
                    # hold until the aborts are seen (generation goes on meanwhile)
                    await asyncio.wait_for(aborts_seen_while_running.wait(), 60)
            return i, text, finish

        watcher = asyncio.create_task(watch_aborts())
        results = await asyncio.gather(*(one(i) for i in range(16)))
        await asyncio.wait_for(watcher, 30)
        await client.close()
        return results

    results = asyncio.run(asyncio.wait_for(run(), 120))
    finished = [r for r in results if r[2] != "client-closed"]
    assert len(finished) == 12 and all(r[2] == "length" for r in finished)
    assert len([r for r in results if r[2] == "client-closed"]) == 4

    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        stats = engine.stats()
        if stats.num_running == 0 and stats.num_waiting == 0 and host.in_flight == 0:
            break
        time.sleep(0.01)
    stats = engine.stats()
    assert stats.num_running == stats.num_waiting == 0 and host.in_flight == 0
    assert stats.num_free_blocks == stats.num_blocks  # only prefix-cached (evictable) blocks left
    text = httpx.get(url + "/metrics").text
    assert _metric(text, "metrale:kv_cache_usage_perc") == 0.0
    assert _metric(text, "metrale:num_requests_running") == 0.0
    assert _metric(text, "metrale:request_success_total", finished_reason="abort") - aborted_before == 4
    assert re.search(r'^metrale:generation_tokens_total\{model_name="scripted"\} \d', text, re.M)
