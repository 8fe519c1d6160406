"""``met`` end to end in a subprocess: output on stdout only, clear one-line errors, exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest


def met(*args, stdin=None, timeout=300):
    env = dict(os.environ, METRALE_LOG="warning", PYTHONUNBUFFERED="1")
    return subprocess.run(
        [sys.executable, "-m", "metrale_core", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def assert_clean_error(proc, *needles):
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.stdout == ""
    for needle in needles:
        assert needle.lower() in proc.stderr.lower(), proc.stderr


def test_version():
    proc = met("--version")
    assert proc.returncode == 0
    assert proc.stdout.startswith("met 0.")


def test_plugins_lists_core_and_qwen3():
    proc = met("plugins")
    assert proc.returncode == 0, proc.stderr
    assert "metrale-core" in proc.stdout and "metrale-qwen3" in proc.stdout
    assert "llama" in proc.stdout and "qwen3" in proc.stdout
    data = json.loads(met("plugins", "--json").stdout)
    assert any(p["distribution"] == "metrale-qwen3" for p in data)


@pytest.mark.parametrize("kv", [(), ("--kv-cache-dtype", "q8_0")], ids=["model-dtype-kv", "q8_0-kv"])
def test_generate_chat_on_embedded_model(kv):
    proc = met("generate", "--chat", "What is the capital of France?", "--max-tokens", "20", *kv)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "The capital of France is Paris.\n"


@pytest.mark.parametrize(
    "flag,value", [("--max-tokens", "0"), ("--max-tokens", "-3"), ("--temperature", "-1"), ("--top-p", "0")]
)
def test_bad_sampling_values(flag, value):
    assert_clean_error(met("generate", "hello", flag, value), flag.lstrip("-").replace("-", "_"))


def test_empty_prompt():
    assert_clean_error(met("generate", ""), "empty")


def test_prompt_longer_than_context():
    assert_clean_error(met("generate", "word " * 50, "--max-model-len", "16"), "exceeds max_model_len")


def test_missing_model_path(tmp_path):
    assert_clean_error(met("generate", "--model", str(tmp_path / "nope"), "hi"), "nope")


def test_unknown_model_type(tmp_path):
    (tmp_path / "config.json").write_text(
        json.dumps({"model_type": "frobnicator", "architectures": ["FrobForCausalLM"]})
    )
    import torch
    from safetensors.torch import save_file

    save_file({"w": torch.zeros(2)}, str(tmp_path / "model.safetensors"))
    assert_clean_error(met("generate", "--model", str(tmp_path), "hi"), "frobnicator", "qwen3", "llama")


def test_corrupt_safetensors(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (tmp_path / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json")
    assert_clean_error(met("generate", "--model", str(tmp_path), "hi"), "model.safetensors")


def test_truncated_gguf(tmp_path):
    from metrale_core.loading.embedded import default_model_path

    src = default_model_path(progress=False)
    bad = tmp_path / "truncated.gguf"
    with open(src, "rb") as f:
        bad.write_bytes(f.read(5_000_000))
    assert_clean_error(met("generate", "--model", str(bad), "hi"), "truncated.gguf")


@pytest.mark.parametrize("fmt", ["bf16", "int8", "int4"])
def test_weight_format_flag_reaches_the_loader(fmt):
    """--weight-format reaches the model loader, and the lossy formats keep this chat's reference
    answer: the prompt is prefilled through the bfloat16 copy, the answer decoded from the codes
    (int4: the GGUF's own 4-bit codes through torch's int4 kernel)."""
    answer = "The capital of France is Paris.\n"
    # every thread count gives the same answer: the bfloat16 matmuls run the C kernel, whose rows
    # do not depend on the thread count or the call's other rows (oneDNN's answered nonsense at 2)
    for threads in ("2", "1"):
        chat = ("--chat", "What is the capital of France?", "--max-tokens", "20", "--threads", threads)
        proc = met("generate", "--weight-format", fmt, *chat)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout == answer, threads


def test_bad_weight_format_is_an_argparse_error():
    proc = met("generate", "--weight-format", "int3", "hi")
    assert proc.returncode == 2 and "invalid choice" in proc.stderr


def test_threads_flag_sets_torch_threads_for_every_thread():
    import argparse
    import threading

    import torch

    from metrale_core.cli.flags import add_engine_flags, load_options_from_args

    parser = argparse.ArgumentParser()
    add_engine_flags(parser)
    before = torch.get_num_threads()
    try:
        options = load_options_from_args(parser.parse_args(["--threads", "1", "--weight-format", "int4"]))
        assert options.weight_format == "int4"
        seen = []
        worker = threading.Thread(target=lambda: seen.append(torch.get_num_threads()))
        worker.start()
        worker.join()
        assert torch.get_num_threads() == 1 and seen == [1]  # the engine thread gets it too
    finally:
        torch.set_num_threads(before)
    assert load_options_from_args(parser.parse_args([])).weight_format is None
    assert torch.get_num_threads() == before  # no flag, no change
    with pytest.raises(SystemExit):
        parser.parse_args(["--threads", "0"])


def test_size_flag_parses_sizes_and_names_its_default(capsys):
    import argparse

    from metrale_core.cli.flags import add_size_flag

    parser = argparse.ArgumentParser()
    add_size_flag(parser, "--pool", "512M", "bytes for the pool")
    assert parser.parse_args([]).pool == 512 << 20
    assert parser.parse_args(["--pool", "2G"]).pool == 2 << 30
    assert "--pool SIZE bytes for the pool (default: 512M)" in " ".join(parser.format_help().split())
    with pytest.raises(SystemExit):
        parser.parse_args(["--pool", "lots"])
    assert "not a size: 'lots'" in capsys.readouterr().err
