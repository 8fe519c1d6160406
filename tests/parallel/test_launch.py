"""``metrale_core.parallel``: what is refused before any process starts or weight is read.

The running job (mp / env executors, faults, no orphans) is tested end to end by
``tests/server/test_serve_tensor_parallel.py`` and the model plugins' tensor-parallel tests."""

from __future__ import annotations

import pytest

from metrale_core.cli.main import main
from metrale_core.errors import ConfigError
from metrale_core.parallel.distributed import ENV_KEYS, Rendezvous, rendezvous_from_env
from metrale_core.parallel.launch import check_engine_config, load_parallel


def test_met_worker_without_the_torch_distributed_environment_says_what_is_missing(monkeypatch, capsys):
    for key in ENV_KEYS:
        monkeypatch.delenv(key, raising=False)
    assert main(["worker"]) == 2
    assert "lacks MASTER_ADDR, MASTER_PORT, WORLD_SIZE, RANK" in capsys.readouterr().err


def test_rendezvous_reads_torchruns_variables():
    env = {"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500", "WORLD_SIZE": "4", "RANK": "3"}
    rdv = rendezvous_from_env(env)
    assert rdv == Rendezvous("10.0.0.1", 29500, 4, 3)
    assert rdv.env(2) == {**env, "RANK": "2", "LOCAL_RANK": "2"}


def test_executors_refuse_what_they_cannot_run(monkeypatch, tmp_path):
    with pytest.raises(ConfigError, match="'uni' executor runs one process"):
        load_parallel(tmp_path, size=2, backend="uni", progress=False)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    with pytest.raises(ConfigError, match="RANK is 1; run 'met worker' on the other ranks"):
        load_parallel(tmp_path, size=2, backend="env", progress=False)
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(ConfigError, match="WORLD_SIZE is 2 but --tensor-parallel-size is 3"):
        load_parallel(tmp_path, size=3, backend="env", progress=False)
    with pytest.raises(ConfigError, match="unknown executor 'nope'"):
        load_parallel(tmp_path, size=2, backend="nope", progress=False)


def test_tensor_parallelism_refuses_what_it_does_not_shard():
    from metrale_core.engine import EngineConfig

    check_engine_config(EngineConfig(plugin_options={"speculative": "ngram"}), 1)  # one rank: anything goes
    with pytest.raises(ConfigError, match="--speculative is not supported with --tensor-parallel-size 2"):
        check_engine_config(EngineConfig(plugin_options={"speculative": "ngram"}), 2)
