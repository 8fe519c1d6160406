"""The GGUF header reader (``metrale_core.weights.gguf_file.GGUFFile``) against ``gguf.GGUFReader``,
the reference implementation of the format: same fields (types and values), same tensors (type,
dims, offsets, and data views of the same dtype, shape and bytes), on a file with every value type
and on the embedded SmolLM2 GGUF; and a damaged header fails as a damaged file."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest

from metrale_core.errors import CorruptWeightsFile
from metrale_core.weights.gguf_file import GGUFFile, open_gguf


def _same(ours: GGUFFile, ref: gguf.GGUFReader) -> None:
    assert list(ours.fields) == list(ref.fields)
    for key, field in ref.fields.items():
        mine = ours.fields[key]
        assert mine.types == field.types, key
        if mine.types[:2] == [gguf.GGUFValueType.ARRAY] * 2:
            continue  # gguf flattens nested arrays (its FIXME); ours keeps them nested, checked below
        value, expected = mine.contents(), field.contents()
        assert value == expected and type(value) is type(expected), key
    assert ours.data_offset == ref.data_offset
    assert [t.name for t in ours.tensors] == [t.name for t in ref.tensors]
    for mine, t in zip(ours.tensors, ref.tensors, strict=True):
        assert (mine.tensor_type, mine.shape.tolist(), mine.n_elements, mine.n_bytes, mine.data_offset) == (
            t.tensor_type,
            t.shape.tolist(),
            t.n_elements,
            t.n_bytes,
            t.data_offset,
        ), t.name
        assert mine.data.dtype == t.data.dtype and mine.data.shape == t.data.shape, t.name
        assert np.array_equal(mine.data, t.data), t.name


def _every_type(path: Path, alignment: int = 64) -> Path:
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_custom_alignment(alignment)
    V = gguf.GGUFValueType
    for i, (kind, value) in enumerate(
        [
            (V.UINT8, 200),
            (V.INT8, -100),
            (V.UINT16, 60000),
            (V.INT16, -30000),
            (V.UINT32, 4_000_000_000),
            (V.INT32, -2_000_000_000),
            (V.FLOAT32, 0.1),
            (V.UINT64, 2**63 + 5),
            (V.INT64, -(2**62)),
            (V.FLOAT64, 1e-300),
            (V.BOOL, True),
            (V.STRING, "naïve — ünïcode ✓"),
        ]
    ):
        w.add_key_value(f"test.scalar{i}", value, kind)
    w.add_array("test.ints", [1, -2, 3])
    w.add_array("test.floats", [0.5, -1.25])
    w.add_array("test.strings", ["a", "", "ü" * 3, "<|im_start|>"])
    w.add_array("test.bools", [True, False])
    w.add_key_value("test.nested", [[1, 2], [3]], V.ARRAY)
    rng = np.random.default_rng(0)
    w.add_tensor("f32", rng.standard_normal((3, 5)).astype(np.float32))
    w.add_tensor("f16", rng.standard_normal((2, 7)).astype(np.float16))
    w.add_tensor("i32", np.arange(6, dtype=np.int32).reshape(2, 3))
    q8 = gguf.quants.quantize(rng.standard_normal((4, 64)).astype(np.float32), gguf.GGMLQuantizationType.Q8_0)
    w.add_tensor("q8", q8, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    q4k = rng.integers(0, 256, size=(2, 144), dtype=np.uint8)  # two rows of one 256-value block (bytes only)
    w.add_tensor("q4k", q4k, raw_dtype=gguf.GGMLQuantizationType.Q4_K)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize("alignment", [32, 64])
def test_every_value_and_tensor_type_reads_as_gguf_reads_it(tmp_path, alignment):
    path = _every_type(tmp_path / "all.gguf", alignment)
    ours = GGUFFile(path)
    _same(ours, gguf.GGUFReader(path, "r"))
    assert ours.fields["test.strings"].count == 4
    assert ours.fields["test.nested"].contents() == [[1, 2], [3]]
    assert ours.data_offset % alignment == 0


def test_the_embedded_model_reads_as_gguf_reads_it(real_gguf):
    _same(GGUFFile(real_gguf), gguf.GGUFReader(real_gguf, "r"))


def test_a_header_cut_anywhere_is_a_damaged_file(tmp_path):
    data = _every_type(tmp_path / "all.gguf").read_bytes()
    header = GGUFFile(tmp_path / "all.gguf").data_offset - 64  # before the alignment padding
    for cut in sorted({4, 8, 20, 40, header // 3, header // 2, 2 * header // 3, header - 1}):
        bad = tmp_path / f"cut{cut}.gguf"
        bad.write_bytes(data[:cut])
        with pytest.raises(CorruptWeightsFile, match=str(bad)):
            open_gguf(bad)


def test_an_unknown_value_type_is_a_damaged_file(tmp_path):
    path = _every_type(tmp_path / "all.gguf")
    data = bytearray(path.read_bytes())
    key = b"test.scalar0"
    at = data.index(key) + len(key)  # the value type follows the key
    data[at : at + 4] = (99).to_bytes(4, "little")
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(bytes(data))
    with pytest.raises(CorruptWeightsFile, match="unknown GGUF value type 99"):
        open_gguf(bad)
