"""``/v1/embeddings`` on a random Qwen3 checkpoint (the real loader) served by real uvicorn, with
the official ``openai`` client: vectors equal the L2-normalised mean (or last row) of HF
transformers' ``last_hidden_state`` (after the final norm), batched and single requests agree,
float and base64 agree, embeddings run batched with generation and keep no KV, and bad input is
a 400 naming the field."""

from __future__ import annotations

import base64

import httpx
import numpy as np
import openai
import pytest
import torch
from server_testlib import checkpoint_loader

import metrale_qwen3  # noqa: F401 -- a hard test dependency: missing is an error, not a skip
from metrale_core.testing.random_checkpoint import write_random_checkpoint

TEXTS = ["The quick brown fox", "jumps over the lazy dog and keeps running far away", "x"]


@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("embed-qwen3")
    hf = write_random_checkpoint(
        path, hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-6
    )
    return path, hf


@pytest.fixture(scope="module")
def served(qwen3_dir, start_server):
    from metrale_core.plugin.discovery import load_registry

    path, hf = qwen3_dir
    server, host = start_server(loader=checkpoint_loader(path, load_registry()), served_model_name="tiny")
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=120)
    return server, host, client, hf


def _hf_vectors(hf, ids_list, mode="mean"):
    out = []
    with torch.no_grad():
        for ids in ids_list:
            hidden = hf.model(torch.tensor([ids])).last_hidden_state[0]
            v = hidden.mean(0) if mode == "mean" else hidden[-1]
            out.append(torch.nn.functional.normalize(v, dim=0).numpy())
    return out


def test_float_vectors_match_hf_mean_of_last_hidden_state(served):
    _, host, client, hf = served
    tok = host.served.tokenizer
    r = client.embeddings.create(model="tiny", input=TEXTS, encoding_format="float")
    assert [d.index for d in r.data] == [0, 1, 2]
    ids = [tok.encode(t, add_special_tokens=True) for t in TEXTS]
    assert r.usage.prompt_tokens == r.usage.total_tokens == sum(map(len, ids))
    for got, want in zip(r.data, _hf_vectors(hf, ids)):
        got = np.asarray(got.embedding)
        assert got.shape == (64,)
        assert abs(np.linalg.norm(got) - 1.0) < 1e-5
        assert np.abs(got - want).max() <= 1e-5


def test_batched_equals_single_and_base64_equals_float(served):
    _, _, client, _ = served
    batched = client.embeddings.create(model="tiny", input=TEXTS)  # the client's default: base64
    for i, text in enumerate(TEXTS):
        single = client.embeddings.create(model="tiny", input=text, encoding_format="float")
        assert np.abs(np.asarray(batched.data[i].embedding) - np.asarray(single.data[0].embedding)).max() <= 1e-5


def test_token_id_inputs(served):
    server, _, client, hf = served
    ids = [[5, 6, 7, 8, 9, 10, 11], [40, 41]]
    r = client.embeddings.create(model="tiny", input=ids, encoding_format="float")
    for got, want in zip(r.data, _hf_vectors(hf, ids)):
        assert np.abs(np.asarray(got.embedding) - want).max() <= 1e-5
    raw = httpx.post(
        server.url + "/v1/embeddings", json={"model": "tiny", "input": ids[0], "encoding_format": "base64"}
    ).json()
    vec = np.frombuffer(base64.b64decode(raw["data"][0]["embedding"]), dtype="<f4")
    assert np.abs(vec - _hf_vectors(hf, ids[:1])[0]).max() <= 1e-5
    assert raw["usage"] == {"prompt_tokens": 7, "total_tokens": 7} and raw["object"] == "list"


def test_long_input_is_chunked_and_prefix_cache_does_not_skip_rows(served):
    """A 45-token prompt takes several 16-token prefill chunks; asking twice (the second time
    its blocks are in the prefix cache) gives the same, HF-equal vector."""
    _, _, client, hf = served
    ids = [int(t) for t in torch.randint(3, 200, (45,), generator=torch.Generator().manual_seed(1))]
    want = _hf_vectors(hf, [ids])[0]
    for _ in range(2):
        got = client.embeddings.create(model="tiny", input=[ids], encoding_format="float")
        assert np.abs(np.asarray(got.data[0].embedding) - want).max() <= 1e-5


def test_embeddings_batch_with_generation_and_keep_no_kv(served):
    import concurrent.futures

    _, host, client, hf = served
    engine = host.served.engine
    ids = [[7, 8, 9, 10, 11, 12]] * 3

    def generate():
        return client.completions.create(model="tiny", prompt="hello world", max_tokens=24, temperature=0)

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        gen = pool.submit(generate)
        embs = [
            pool.submit(client.embeddings.create, model="tiny", input=ids, encoding_format="float") for _ in range(2)
        ]
        results = [e.result() for e in embs]
        assert gen.result().usage.completion_tokens == 24
    want = _hf_vectors(hf, ids[:1])[0]
    for r in results:
        for d in r.data:
            assert np.abs(np.asarray(d.embedding) - want).max() <= 1e-5
    stats = engine.stats()
    assert stats.num_running == 0 and stats.num_free_blocks == stats.num_blocks


def test_last_token_pooling_flag(qwen3_dir, start_server):
    from metrale_core.plugin.discovery import load_registry

    path, hf = qwen3_dir
    server, _ = start_server(loader=checkpoint_loader(path, load_registry()), served_model_name="tiny", pooling="last")
    c = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=120)
    ids = [[5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22]]
    got = c.embeddings.create(model="tiny", input=ids, encoding_format="float").data[0].embedding
    assert np.abs(np.asarray(got) - _hf_vectors(hf, ids, mode="last")[0]).max() <= 1e-5


@pytest.mark.parametrize(
    "body,field",
    [
        ({"input": ""}, "input[0]"),
        ({"input": []}, "input"),
        ({"input": [1, "a"]}, "input"),
        ({"input": 5}, "input"),
        ({"input": [[1, 2], []]}, "input"),
        ({"input": [10**9]}, "input[0]"),
        ({"input": "hi", "dimensions": 32}, "dimensions"),
        ({"input": "hi", "encoding_format": "int8"}, "encoding_format"),
        ({"input": "hi", "bogus": True}, "bogus"),
        ({"input": "hi", "model": "other"}, "model"),
        ({"input": "word " * 600}, "input[0]"),
        ({}, "input"),
    ],
)
def test_bad_input_is_a_4xx_naming_the_field(served, body, field):
    server = served[0]
    r = httpx.post(server.url + "/v1/embeddings", json={"model": "tiny", **body}, timeout=30)
    assert 400 <= r.status_code < 500, (r.status_code, r.text)
    error = r.json()["error"]
    assert field in error["message"] and set(error) == {"message", "type", "param", "code"}


def test_bodies_match_the_documented_schema(served):
    """Float and base64 lists validate against the OpenAPI document's ``EmbeddingList``."""
    from openapi_checks import Checked, documented_schema

    server = served[0]
    operation = documented_schema(server.url, "tiny")["/v1/embeddings"]["POST"]
    checked = Checked()
    for body in ({"model": "tiny", "input": TEXTS}, {"model": "tiny", "input": "x", "encoding_format": "base64"}):
        response = checked.call(operation.Case(body=body, media_type="application/json"), server.url)
        assert response.status_code == 200, response.text[:300]
    assert not checked.mismatches, "\n".join(checked.mismatches)
