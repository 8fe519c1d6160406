"""Every way a checkpoint can be broken raises the right WeightsError subclass with a useful message."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import gguf
import pytest
from weights_testutil import hf_to_gguf, tiny_hf_model

from metrale_core.errors import CorruptWeightsFile, MissingWeightsFile, ShapeMismatch, WeightsError
from metrale_core.weights import open_weights
from metrale_core.weights.gguf_file import check_tensor_extent


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    model, _ = tiny_hf_model("qwen3", tie=True)
    directory = tmp_path_factory.mktemp("hf")
    model.save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def sharded_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    model, _ = tiny_hf_model("llama", tie=False)
    directory = tmp_path_factory.mktemp("sharded")
    model.save_pretrained(directory, max_shard_size="40KB")
    return directory


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    model, hp = tiny_hf_model("llama", tie=False)
    state = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    hf_to_gguf(
        path,
        "llama",
        hp,
        state,
        lambda n, v: gguf.GGMLQuantizationType.Q8_0 if v.ndim == 2 else gguf.GGMLQuantizationType.F32,
    )
    return path


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def test_missing_path(tmp_path: Path) -> None:
    with pytest.raises(MissingWeightsFile, match=r"nowhere.*does not exist"):
        open_weights(tmp_path / "nowhere")


def test_dir_without_config(tmp_path: Path, hf_dir: Path) -> None:
    d = _copy(hf_dir, tmp_path / "c")
    (d / "config.json").unlink()
    with pytest.raises(MissingWeightsFile, match=r"has no config\.json.*\.gguf file"):
        open_weights(d)


def test_dir_with_several_ggufs_and_no_config(tmp_path: Path, gguf_file: Path) -> None:
    for name in ("a.gguf", "b.gguf"):
        shutil.copy(gguf_file, tmp_path / name)
    with pytest.raises(MissingWeightsFile, match=r"several \.gguf files \(a\.gguf, b\.gguf\)"):
        open_weights(tmp_path)


def test_dir_without_safetensors(tmp_path: Path, hf_dir: Path) -> None:
    d = _copy(hf_dir, tmp_path / "c")
    (d / "model.safetensors").unlink()
    with pytest.raises(MissingWeightsFile, match=r"no weights: expected model\.safetensors"):
        open_weights(d)
    (d / "pytorch_model.bin").write_bytes(b"not unpickled")
    with pytest.raises(MissingWeightsFile, match=r"pickled PyTorch weights \(pytorch_model\.bin\).*never loads"):
        open_weights(d)


def test_invalid_config_json(tmp_path: Path, hf_dir: Path) -> None:
    d = _copy(hf_dir, tmp_path / "c")
    (d / "config.json").write_text('{"model_type": "qwen3",')
    with pytest.raises(CorruptWeightsFile, match=r"config\.json is not valid JSON"):
        open_weights(d)


def test_truncated_safetensors(tmp_path: Path, hf_dir: Path) -> None:
    d = _copy(hf_dir, tmp_path / "c")
    f = d / "model.safetensors"
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    with pytest.raises(CorruptWeightsFile, match=r"model\.safetensors is not a valid safetensors file.*truncated"):
        open_weights(d)


def test_garbage_safetensors_header(tmp_path: Path, hf_dir: Path) -> None:
    d = _copy(hf_dir, tmp_path / "c")
    f = d / "model.safetensors"
    data = bytearray(f.read_bytes())
    data[:16] = b"\xff" * 16
    f.write_bytes(bytes(data))
    with pytest.raises(CorruptWeightsFile, match=r"model\.safetensors is not a valid safetensors file"):
        open_weights(d)


def test_missing_shard(tmp_path: Path, sharded_dir: Path) -> None:
    d = _copy(sharded_dir, tmp_path / "s")
    index = json.loads((d / "model.safetensors.index.json").read_text())
    victim = sorted(set(index["weight_map"].values()))[1]
    (d / victim).unlink()
    with pytest.raises(MissingWeightsFile, match=f"missing shard file.*{victim}"):
        open_weights(d)


def test_index_pointing_at_wrong_shard(tmp_path: Path, sharded_dir: Path) -> None:
    d = _copy(sharded_dir, tmp_path / "s")
    path = d / "model.safetensors.index.json"
    index = json.loads(path.read_text())
    shards = sorted(set(index["weight_map"].values()))
    name = next(k for k, v in index["weight_map"].items() if v == shards[0])
    index["weight_map"][name] = shards[1]
    path.write_text(json.dumps(index))
    with pytest.raises(CorruptWeightsFile, match=f"places tensor '{name}' in {shards[1]}"):
        open_weights(d)


def test_truncated_gguf(tmp_path: Path, gguf_file: Path) -> None:
    f = tmp_path / "half.gguf"
    f.write_bytes(gguf_file.read_bytes()[: gguf_file.stat().st_size // 2])
    with pytest.raises(CorruptWeightsFile, match=r"half\.gguf.*truncated"):
        open_weights(f)


def test_gguf_cut_inside_metadata(tmp_path: Path, gguf_file: Path) -> None:
    f = tmp_path / "head.gguf"
    f.write_bytes(gguf_file.read_bytes()[:200])
    with pytest.raises(CorruptWeightsFile, match=r"head\.gguf is not a readable GGUF file"):
        open_weights(f)


def test_gguf_last_tensor_short(tmp_path: Path, gguf_file: Path) -> None:
    f = tmp_path / "short.gguf"
    f.write_bytes(gguf_file.read_bytes()[:-40])  # only the end of the last tensor's data is lost
    with pytest.raises(CorruptWeightsFile, match=r"short\.gguf"):
        open_weights(f)


def test_gguf_extent_check_names_tensor_and_sizes(gguf_file: Path) -> None:
    # GGUFReader itself already fails on short files; this is our own second line of defence.
    reader = gguf.GGUFReader(gguf_file)
    t = reader.tensors[-1]
    shape = tuple(int(d) for d in reversed(t.shape.tolist()))
    size = gguf_file.stat().st_size
    check_tensor_extent(gguf_file, t, shape, size)  # the intact file passes
    with pytest.raises(CorruptWeightsFile, match=rf"tensor {re.escape(t.name)} needs bytes .* has {size - 1} bytes"):
        check_tensor_extent(gguf_file, t, shape, size - 1)
    with pytest.raises(CorruptWeightsFile, match=rf"tensor {re.escape(t.name)} of shape \[{shape[0]}, 33\].*block"):
        check_tensor_extent(gguf_file, t, (shape[0], 33), size)


def test_garbage_gguf(tmp_path: Path) -> None:
    f = tmp_path / "garbage.gguf"
    f.write_bytes(b"\x00\x01garbage" * 100)
    with pytest.raises(CorruptWeightsFile, match=r"garbage\.gguf is not a GGUF file"):
        open_weights(f)
    f.write_bytes(b"GGUF" + b"\xff" * 400)  # right magic, nonsense after it
    with pytest.raises(CorruptWeightsFile, match=r"garbage\.gguf is not a readable GGUF file"):
        open_weights(f)
    f.write_bytes(b"")
    with pytest.raises(CorruptWeightsFile, match=r"garbage\.gguf is not a GGUF file"):
        open_weights(f)


def test_other_files_are_refused(tmp_path: Path, hf_dir: Path) -> None:
    with pytest.raises(WeightsError, match="pass its directory"):
        open_weights(hf_dir / "model.safetensors")
    other = tmp_path / "notes.txt"
    other.write_text("hello")
    with pytest.raises(WeightsError, match="neither a checkpoint directory nor a GGUF file"):
        open_weights(other)


@pytest.mark.parametrize("which", ["hf", "gguf"])
def test_shape_mismatch_and_unknown_name(which: str, hf_dir: Path, gguf_file: Path) -> None:
    store = open_weights(hf_dir if which == "hf" else gguf_file)
    name = "model.layers.0.self_attn.k_proj.weight"
    expected_shape = [64, 64] if which == "hf" else [32, 64]
    with pytest.raises(ShapeMismatch, match=rf"'{name}'.*shape {re.escape(str(expected_shape))}.*expects \[4, 4\]"):
        store.get(name, shape=(4, 4))
    with pytest.raises(
        WeightsError,
        match=r"'model\.layers\.0\.self_attn\.kk_proj\.weight' is not in .*"
        r"similar names: model\.layers\.0\.self_attn\.k_proj\.weight",
    ):
        store.get("model.layers.0.self_attn.kk_proj.weight")
    with pytest.raises(WeightsError, match=r"'nope' is not in"):
        store.quant_type("nope")
    with pytest.raises(WeightsError, match=r"'nope' is not in"):
        store.get_raw("nope")
