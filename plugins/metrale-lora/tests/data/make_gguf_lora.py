"""Regenerate ``llama_lora/`` (a PEFT adapter on a tiny random Llama) and ``llama_lora.gguf`` /
``llama_lora.q8_0.gguf`` (the same adapter converted by llama.cpp's own ``convert_lora_to_gguf.py``,
``--outtype f32`` and ``q8_0``): the fixtures of
``test_gguf_lora.py``, whose oracle is that converter's output.  Not run by the tests.

    python make_gguf_lora.py LLAMA_CPP_DIR   # e.g. vendor/llama.cpp of the llama-cpp-python 0.3.36 sdist

Owner: ``plugins/metrale-lora/tests``.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))


def main(llama_cpp: Path) -> None:
    from lora_harness import GGUF_FIXTURE_BASE, random_hf, save_adapter
    from transformers import LlamaConfig, LlamaForCausalLM

    base = random_hf(LlamaConfig, LlamaForCausalLM, 7, **GGUF_FIXTURE_BASE)
    adapter = HERE / "llama_lora"
    save_adapter(
        base,
        adapter,
        11,
        r=4,
        lora_alpha=12,
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    )
    (adapter / "README.md").unlink(missing_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        base.config.architectures = ["LlamaForCausalLM"]
        base.config.save_pretrained(tmp)  # the converter reads only the base's config
        for outtype, name in (("f32", "llama_lora.gguf"), ("q8_0", "llama_lora.q8_0.gguf")):
            subprocess.run(
                [
                    sys.executable,
                    str(llama_cpp / "convert_lora_to_gguf.py"),
                    "--base",
                    tmp,
                    "--outtype",
                    outtype,
                    "--outfile",
                    str(HERE / name),
                    str(adapter),
                ],
                check=True,
                env={"PYTHONPATH": str(llama_cpp / "gguf-py"), "PATH": "/usr/bin:/bin"},
            )


if __name__ == "__main__":
    main(Path(sys.argv[1]))
