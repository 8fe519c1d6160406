"""Multi-LoRA over HTTP with the official client: ``model`` picks the adapter, ``/v1/models``
lists adapters with ``parent``, run-time load/unload, and LRU eviction with ``--max-loras 2`` and
four adapters in rotation gives the outputs of a server that never evicts."""

from __future__ import annotations

import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests" / "server"))

from server_testlib import wait_ready, write_tokenizer

ADAPTERS = {
    "a0": {"r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj"]},
    "a1": {"r": 8, "lora_alpha": 8, "target_modules": ["gate_proj", "up_proj", "down_proj"]},
    "a2": {"r": 4, "lora_alpha": 16, "use_rslora": True, "target_modules": ["o_proj", "k_proj"]},
    "a3": {"r": 2, "lora_alpha": 4, "target_modules": ["q_proj", "k_proj", "v_proj", "down_proj"]},
}
PROMPTS = ["abc", "hello there", "lora"]


@pytest.fixture(scope="module")
def byte_tokenizer(tmp_path_factory):
    from metrale_core.text.tokenizer import Tokenizer

    return Tokenizer.from_dir(write_tokenizer(tmp_path_factory.mktemp("bytetok")))


@pytest.fixture(scope="module")
def start_server():
    """``start_server(loader, **server options) -> (RunningServer, EngineHost)``; stopped at the end."""
    from metrale_core.server import ServerConfig, create_app, serve_in_thread

    running = []

    def start(*, loader, registry, **options):
        app = create_app(ServerConfig(**options), loader, registry)
        server = serve_in_thread(app)
        running.append(server)
        wait_ready(server.url, timeout=120)
        return server, app.state.host

    yield start
    for server in running:
        server.stop()


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, byte_tokenizer):
    import copy

    from peft import LoraConfig, get_peft_model
    from transformers import Qwen3Config, Qwen3ForCausalLM

    root = tmp_path_factory.mktemp("lora-http")
    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=byte_tokenizer.vocab_size,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        tie_word_embeddings=True,
    )
    base = Qwen3ForCausalLM(config).eval()
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in base.named_parameters():
            p.copy_(
                1.0 + 0.2 * torch.randn(p.shape, generator=gen)
                if "norm" in name
                else 0.3 * torch.randn(p.shape, generator=gen)
            )
    base.save_pretrained(root / "base")
    for i, (name, cfg) in enumerate(ADAPTERS.items()):
        peft_model = get_peft_model(copy.deepcopy(base), LoraConfig(init_lora_weights=False, **cfg))
        g = torch.Generator().manual_seed(i + 10)
        with torch.no_grad():
            for pname, p in peft_model.named_parameters():
                if "lora_" in pname:
                    p.copy_(0.5 * torch.randn(p.shape, generator=g))
        peft_model.save_pretrained(root / name)
    bad = root / "pickled"
    bad.mkdir()
    (bad / "adapter_config.json").write_text((root / "a0" / "adapter_config.json").read_text())
    (bad / "adapter_model.bin").write_bytes(b"\x80\x04not really a pickle")
    return root


@pytest.fixture(scope="module")
def lora_server(start_server, checkpoints, byte_tokenizer):
    def make(max_loras: int, runtime: bool, api_key: str | None = None):
        from metrale_core.engine import EngineConfig, LLMEngine
        from metrale_core.plugin.components import LoadOptions
        from metrale_core.plugin.discovery import load_registry
        from metrale_core.server import ServedModel
        from metrale_core.weights import open_weights

        registry = load_registry()

        def load():
            store = open_weights(checkpoints / "base")
            model = registry.find_model_loader(store.config).factory(store, LoadOptions(weight_format="exact"))
            options = {
                "lora": [f"{n}={checkpoints / n}" for n in ADAPTERS],
                "max_loras": max_loras,
                "max_lora_rank": 8,
                "allow_runtime_lora": runtime,
            }
            engine = LLMEngine(
                model,
                EngineConfig(
                    block_size=4, num_kv_blocks=512, max_num_seqs=16, max_prefill_tokens=64, plugin_options=options
                ),
                tokenizer=byte_tokenizer,
                registry=registry,
            )
            return ServedModel(engine=engine, tokenizer=byte_tokenizer, model_type="qwen3")

        server, host = start_server(loader=load, registry=registry, served_model_name="base", api_key=api_key)
        client = openai.OpenAI(base_url=server.url + "/v1", api_key=api_key or "unused", max_retries=0, timeout=60)
        return server, host, client

    return make


def _complete(client, model: str, prompt: str) -> str:
    return client.completions.create(model=model, prompt=prompt, max_tokens=6, temperature=0.0).choices[0].text


def test_model_picks_the_adapter_and_eviction_changes_nothing(lora_server):
    _, host2, evicting = lora_server(max_loras=2, runtime=False)
    _, _, roomy = lora_server(max_loras=4, runtime=False)
    rotation = [(m, p) for p in PROMPTS for m in ("base", *ADAPTERS)]
    want = {(m, p): _complete(roomy, m, p) for m, p in rotation}
    got = {(m, p): _complete(evicting, m, p) for m, p in rotation}
    assert got == want
    assert host2.served.engine.runner.lora.num_slot_writes > len(ADAPTERS)  # evictions happened
    assert len({want[(m, "hello there")] for m in ("base", *ADAPTERS)}) >= 4  # adapters matter
    # concurrently (mixed batches, at most 2 adapters at once) = sequentially
    with ThreadPoolExecutor(8) as pool:
        futures = {key: pool.submit(_complete, evicting, *key) for key in rotation}
        assert {key: f.result() for key, f in futures.items()} == want
    models = {m.id: m for m in evicting.models.list().data}
    assert set(models) == {"base", *ADAPTERS}
    assert all(models[a].model_extra.get("parent") == "base" for a in ADAPTERS)
    assert evicting.models.retrieve("a1").model_extra["parent"] == "base"
    with pytest.raises(openai.NotFoundError) as err:
        _complete(evicting, "nope", "abc")
    assert err.value.body["code"] == "model_not_found"
    chat = evicting.chat.completions.create(
        model="a2", messages=[{"role": "user", "content": "hi"}], max_tokens=4, temperature=0.0
    )
    assert chat.model == "a2"
    # runtime loading is off on this server
    r = httpx.post(str(evicting.base_url) + "load_lora_adapter", json={"lora_name": "x", "lora_path": "/nowhere"})
    assert r.status_code == 404 and "--allow-runtime-lora" in r.json()["error"]["message"]


def test_runtime_load_and_unload(lora_server, checkpoints):
    server, host, client = lora_server(max_loras=2, runtime=True, api_key="k3y")
    url = server.url + "/v1/"
    auth = {"Authorization": "Bearer k3y"}
    before = _complete(client, "a0", "abc")
    bank = host.served.engine.runner.lora
    loaded_on: list[threading.Thread] = []

    def spied_load(*args, **kwargs):
        loaded_on.append(threading.current_thread())
        return type(bank).load(bank, *args, **kwargs)

    bank.load = spied_load
    assert (
        httpx.post(
            url + "load_lora_adapter", json={"lora_name": "again", "lora_path": str(checkpoints / "a0")}
        ).status_code
        == 401
    )  # the API key applies
    r = httpx.post(
        url + "load_lora_adapter", headers=auth, json={"lora_name": "again", "lora_path": str(checkpoints / "a0")}
    )
    assert r.status_code == 200, r.text
    assert _complete(client, "again", "abc") == before
    # the load (torch ops) ran on a thread of its own, now gone: no pooled thread keeps an OpenMP
    # team next to the engine's
    assert loaded_on and loaded_on[0].name == "metrale-lora-load"
    loaded_on[0].join(5)
    assert not loaded_on[0].is_alive()
    for path, named in ((checkpoints / "pickled", "adapter_model.bin"), (checkpoints / "missing", "missing")):
        r = httpx.post(url + "load_lora_adapter", headers=auth, json={"lora_name": "bad", "lora_path": str(path)})
        assert r.status_code == 400 and named in r.json()["error"]["message"], r.text
    r = httpx.post(
        url + "load_lora_adapter", headers=auth, json={"lora_name": "a1", "lora_path": str(checkpoints / "a1")}
    )
    assert r.status_code == 400 and "already loaded" in r.text
    assert httpx.post(url + "unload_lora_adapter", headers=auth, json={"lora_name": "again"}).status_code == 200
    with pytest.raises(openai.NotFoundError):
        _complete(client, "again", "abc")
    assert httpx.post(url + "unload_lora_adapter", headers=auth, json={"lora_name": "again"}).status_code == 404
    assert _complete(client, "a0", "abc") == before  # the server kept serving throughout
