"""``met bench serve`` against llama.cpp's ``llama-server`` (natively built; the embedded SmolLM2
GGUF): the same result checks as against ``met serve``, through llama-server's own ``/tokenize``
shape and usage chunk.  The binary is found by ``metrale_core.testing.llamacpp.tool``
(``$METRALE_LLAMACPP_BIN``, else the newest ``scripts/build-llamacpp.sh`` build); where it or the
model is absent the test skips, and fails under ``CI=true``."""

from __future__ import annotations

import subprocess
import time

import httpx
import pytest
from benchlib import assert_sane_level, free_port, read_result, run_met

from metrale_core.testing.llamacpp import tool
from metrale_core.testing.requires import missing


@pytest.fixture(scope="module")
def llama_server(tmp_path_factory):
    from metrale_core.loading.embedded import cache_dir

    binary = tool("llama-server")
    model = cache_dir() / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not model.is_file():
        missing(f"{model} is not cached (run met generate once to fetch it)")
    port = free_port()
    log = tmp_path_factory.mktemp("llama-server") / "server.log"
    cmd = [str(binary), "-m", str(model), "--host", "127.0.0.1", "--port", str(port), "-np", "2", "-c", "1024"]
    with open(log, "wb") as sink:
        proc = subprocess.Popen([*cmd, "-t", "1"], stdout=sink, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180  # generous: a busy 2-core machine
        while True:
            assert proc.poll() is None, log.read_text(errors="replace")[-3000:]
            try:
                if httpx.get(url + "/health", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "llama-server never became healthy"
            time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_bench_serve_against_llama_server(llama_server, endpoint, tmp_path, capsys):
    out = tmp_path / "llama.json"
    code, stdout, stderr = run_met(
        capsys,
        "bench", "serve", "--url", llama_server, "--endpoint", endpoint, "--concurrency", "1,2",
        "--prompt-tokens", "20", "--output-tokens", "8", "--num-prompts", "4", "--result-file", str(out),
    )  # fmt: skip
    assert code == 0, stderr
    result = read_result(out)
    assert result["prompts"]["exact"] is True  # llama-server's /tokenize ({"content"}) was used
    assert result["config"]["model"] == result["server"]["model_entry"]["id"]
    assert [lv["concurrency"] for lv in result["levels"]] == [1, 2]
    for level in result["levels"]:
        assert_sane_level(level, requests=4, output_tokens=8)
        assert level["output_tokens_from"] == "usage"
        if endpoint == "completions":
            assert level["prompt_tokens"] == 4 * 20
    assert "TTFT" in stdout
