"""``met bench engine`` through the CLI on a tiny random GGUF: the llama-bench-like table, the
JSON, and one clear line for a test the model cannot hold.  No speed is asserted."""

from __future__ import annotations

import json
import math

from benchlib import run_met


def test_engine_json_has_every_test(random_gguf, tmp_path, capsys):
    out = tmp_path / "engine.json"
    code, stdout, stderr = run_met(
        capsys,
        "bench", "engine", str(random_gguf), "-p", "24", "-n", "6", "-r", "2", "--batch", "1,3",
        "--threads", "1", "-o", "json", "--result-file", str(out),
    )  # fmt: skip
    assert code == 0, stderr
    result = json.loads(stdout)
    assert result == json.loads(out.read_text())
    assert result["model"] == "tiny-qwen2.gguf" and result["threads"] == 1
    assert [t["test"] for t in result["tests"]] == ["pp24", "tg6", "tg6@b3"]
    for test in result["tests"]:
        assert len(test["runs"]) == 2
        assert all(math.isfinite(r) and r > 0 for r in test["runs"])
        assert min(test["runs"]) <= test["tokens_per_s"] <= max(test["runs"])
        assert test["tokens_per_s_sd"] >= 0


def test_engine_table_and_model_flag(random_gguf, capsys):
    code, stdout, stderr = run_met(
        capsys, "bench", "engine", "--model", str(random_gguf), "-p", "8", "-n", "0", "-r", "1", "--threads", "1"
    )
    assert code == 0, stderr
    header, _, row, *_ = stdout.splitlines()
    assert header.split() == ["model", "format", "threads", "test", "t/s"]
    assert row.split()[:4] == ["tiny-qwen2.gguf", "auto/float32", "1", "pp8"]
    assert "±" in row


def test_a_prompt_over_the_context_is_one_error_line(random_gguf, capsys):
    code, stdout, stderr = run_met(capsys, "bench", "engine", str(random_gguf), "-p", "1000", "-n", "0")
    assert code == 2 and stdout == ""
    assert "pp1000 needs 1001 tokens but the model's context is 256" in stderr
