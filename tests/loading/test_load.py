"""``model_from_store``: the one loading function (target, draft model, MTP layer).

A loader declares the ``--weight-format`` values it honours (``ModelLoaderSpec.weight_formats``);
a request for any other is refused before the loader runs, instead of being silently ignored.
"""

from __future__ import annotations

from typing import ClassVar

import pytest

from metrale_core.errors import ConfigError
from metrale_core.loading.load import model_from_store
from metrale_core.plugin.components import LoadOptions, ModelLoaderSpec
from metrale_core.plugin.registry import Registry


class Store:
    config: ClassVar[dict[str, str]] = {"model_type": "toy"}
    path = "/nowhere/toy"

    def names(self):
        return ["w"]


class Model:
    pass


def _registry(calls, **declared):
    def factory(store, options):
        calls.append(options.weight_format)
        return Model()

    return Registry(model_loaders={"toy": ModelLoaderSpec("toy", factory, model_types="toy", **declared)})


def test_an_undeclared_weight_format_is_refused_before_loading():
    calls: list = []
    reg = _registry(calls)  # declares only the default, "exact"
    with pytest.raises(ConfigError, match=r"--weight-format int4 .* loader 'toy' honours exact"):
        model_from_store(Store(), LoadOptions(weight_format="int4"), reg)
    assert calls == []
    for fmt in (None, "exact"):
        spec, model = model_from_store(Store(), LoadOptions(weight_format=fmt), reg)
        assert spec.name == "toy" and isinstance(model, Model)
        assert model.weight_store.path == "/nowhere/toy"
    assert calls == [None, "exact"]


def test_a_declared_weight_format_reaches_the_loader():
    calls: list = []
    reg = _registry(calls, weight_formats=("exact", "int4"))
    model_from_store(Store(), LoadOptions(weight_format="int4"), reg)
    assert calls == ["int4"]


def test_a_loader_without_tensor_parallelism_is_refused_with_its_reason():
    from metrale_core.errors import ConfigError
    from metrale_core.layers.parallel import TensorParallel
    from metrale_core.loading.load import model_from_store
    from metrale_core.plugin.components import LoadOptions, ModelLoaderSpec
    from metrale_core.plugin.registry import Registry

    called = []
    spec = ModelLoaderSpec(
        "whole",
        factory=lambda store, options: called.append(1),
        model_types=("whole",),
        tensor_parallel_note="its experts are not sharded",
    )
    registry = Registry(model_loaders={"whole": spec})

    class Store:
        def __init__(self):
            self.config = {"model_type": "whole"}

        def names(self):
            return []

    with pytest.raises(
        ConfigError,
        match=r"'whole' loader does not support tensor parallelism "
        r".*--tensor-parallel-size 2.*its experts are not sharded",
    ):
        model_from_store(Store(), LoadOptions(tensor_parallel=TensorParallel(0, 2)), registry)
    assert not called  # refused before any weight is read
