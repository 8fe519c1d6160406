"""The ray executor on a local Ray cluster (``ray.init`` on this machine): TP=2 with the worker as a
Ray actor gives TP=1's greedy tokens, and the actor is gone after the job."""

from __future__ import annotations

import metrale_ray
from metrale_core.engine import EngineConfig, LLMEngine
from metrale_core.loading.load import load_model
from metrale_core.parallel.launch import load_parallel
from metrale_core.plugin.components import LoadOptions
from metrale_core.plugin.discovery import load_registry
from metrale_core.sampling import SamplingParams
from metrale_core.testing.random_checkpoint import write_random_checkpoint
from metrale_core.testing.requires import missing
from metrale_core.testing.tensor_parallel import run_recording

PROMPTS = [[(5 * i + 3 * j) % 90 + 1 for j in range(6 + 5 * i)] for i in range(3)]


def _checkpoint(path):
    from tokenizers import Tokenizer, models

    write_random_checkpoint(path, "Llama", tokenizer=False, vocab_size=91)
    Tokenizer(models.WordLevel({f"t{i}": i for i in range(91)}, unk_token="t0")).save(str(path / "tokenizer.json"))
    return path


def _registry():
    registry = load_registry()
    if "ray" not in registry.executors:  # the distribution is not pip-installed: register as its hook does
        metrale_ray.metrale_executors(lambda spec: registry.executors.__setitem__(spec.name, spec))
    return registry


def _run(model):
    config = EngineConfig(block_size=4, num_kv_blocks=64, max_prefill_tokens=16, max_num_seqs=4)
    return run_recording(
        LLMEngine(model, config), PROMPTS, SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    )


def test_ray_workers_give_the_tokens_of_one_process(tmp_path):
    try:
        import ray
    except ImportError:
        missing("Ray is not installed (pip install -e plugins/metrale-ray installs it)")
    path = _checkpoint(tmp_path)
    options = LoadOptions(weight_format="exact")
    expected = _run(load_model(path, options, progress=False).model)
    loaded = load_parallel(path, options, _registry(), size=2, backend="ray", threads=1, progress=False)
    executor = loaded.model.driver.executor
    try:
        assert type(executor).__name__ == "RayExecutor" and len(executor.actors) == 1
        got = _run(loaded.model)
    finally:
        loaded.model.close()
    assert got.tokens == expected.tokens
    assert not executor.actors and not ray.is_initialized()  # actors killed, the local Ray stopped
