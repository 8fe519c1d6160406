"""``met bench serve`` through the CLI against a real ``met serve`` (uvicorn on loopback, the
scripted model): the JSON result's structure and sane relations, the table, failures counted,
the API key, and one clear line for a server that is not up.  No speed is asserted."""

from __future__ import annotations

import pytest
from benchlib import assert_sane_level, free_port, read_result, run_met


def _bench(capsys, url: str, out, *args: str):
    """``met bench serve --url URL ARGS --result-file OUT``: its exit code, stdout and stderr."""
    return run_met(capsys, "bench", "serve", "--url", url, *args, "--result-file", str(out))


@pytest.fixture
def bench_scripted(start_server, tmp_path, capsys):
    """``bench_scripted(*args)``: ``met bench serve ARGS`` against a fresh scripted server, writing
    ``result.json``; returns its exit code, stdout, stderr and the result file."""
    server, _ = start_server()

    def bench(*args: str):
        out = tmp_path / "result.json"
        return (*_bench(capsys, server.url, out, *args), out)

    return bench


def test_completions_levels_with_exact_prompts(bench_scripted):
    code, stdout, stderr, out = bench_scripted(
        "--concurrency", "1,3", "--prompt-tokens", "20",
        "--output-tokens", "8", "--num-prompts", "4",
    )  # fmt: skip
    assert code == 0, stderr
    result = read_result(out)
    assert result["config"]["model"] == "scripted"  # the first of /v1/models
    assert result["server"]["model_entry"]["id"] == "scripted"
    assert result["prompts"]["exact"] is True  # met serve has /tokenize
    assert result["machine"]["cores"] >= 1
    assert [lv["concurrency"] for lv in result["levels"]] == [1, 3]
    for level in result["levels"]:
        assert_sane_level(level, requests=4, output_tokens=8)
        assert level["output_tokens_from"] == "usage"
        assert level["prompt_tokens"] == 4 * 20  # the prompts were cut to exactly 20 tokens
    rows = [line.split() for line in stdout.splitlines()]
    assert [r[:3] for r in rows if r and r[0] in ("1", "3")] == [["1", "4", "0"], ["3", "4", "0"]]
    assert "exact" in stdout and "TTFT" in stdout


def test_chat_endpoint_and_default_sizes(bench_scripted):
    code, _, stderr, out = bench_scripted(
        "--endpoint", "chat", "--concurrency", "2",
        "--prompt-tokens", "12", "--output-tokens", "5", "--warmup", "0",
    )  # fmt: skip
    assert code == 0, stderr
    (level,) = read_result(out)["levels"]
    assert_sane_level(level, requests=4, output_tokens=5)  # default: max(4, 2 x concurrency)
    assert level["prompt_tokens"] > 4 * 12  # the chat template adds its own tokens


def test_failed_requests_are_counted_not_fatal(bench_scripted):
    code, stdout, _, out = bench_scripted(
        "--model", "no-such-model", "--num-prompts", "3",
        "--prompt-tokens", "8", "--output-tokens", "4",
    )  # fmt: skip
    assert code == 0
    (level,) = read_result(out)["levels"]
    assert (level["completed"], level["failed"]) == (0, 3)
    assert any("404" in e and "no-such-model" in e for e in level["errors"]), level["errors"]
    assert "failed request" in stdout


def test_api_key(start_server, tmp_path, capsys):
    server, _ = start_server(api_key="sk-bench-key")
    code, _, stderr = run_met(capsys, "bench", "serve", "--url", server.url, "--num-prompts", "1")
    assert code == 2 and "--api-key" in stderr and "Traceback" not in stderr
    out = tmp_path / "key.json"
    code, _, stderr = _bench(
        capsys, server.url, out, "--api-key", "sk-bench-key", "--num-prompts", "2",
        "--prompt-tokens", "8", "--output-tokens", "3",
    )  # fmt: skip
    assert code == 0, stderr
    assert_sane_level(read_result(out)["levels"][0], requests=2, output_tokens=3)
    assert read_result(out)["config"]["api_key"] == "***"  # never written to the file


def test_a_server_that_is_not_up_is_one_error_line(capsys):
    url = f"http://127.0.0.1:{free_port()}"
    code, stdout, stderr = run_met(capsys, "bench", "serve", "--url", url)
    assert code == 2 and stdout == ""
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("met: error: cannot reach") and url in lines[0]
