"""The public API of Metrale for plugin authors: everything a plugin needs, from one module.

Owner: ``metrale_core.api``.  Plugins and contrib packages import from here (and ``hookimpl`` /
``__version__`` from ``metrale_core``), never from the implementation modules, which may move:
``from metrale_core.api import ModelLoaderSpec, CustomOp, build_linear``.  The import-linter
contracts in ``pyproject.toml`` (run by ``tests/test_import_contracts.py``) enforce it.  The
plugin guide (``docs/plugin-guide.md``) lists the names by topic.

What is here (see :data:`PUBLIC` for the full table):

- registration: ``hookimpl``, the ``*Spec`` records, ``LoadOptions``, ``lazy_factory``,
  ``load_registry``; errors (``ConfigError``, ``WeightsError``, ``ShapeMismatch``, ...);
- the model contract: ``CausalLM``, ``ForwardBatch``, ``ModelInfo``, ``KVLayout``,
  ``RecurrentLayout``, ``PagedKVCache``, ``KVCodec``, ``gather_blocks``; decoder definitions
  (:mod:`metrale_core.decoder`): ``DecoderSpec`` and its recipe records (``Norms``,
  ``Attention``, ``Mlp``, ``LayerPattern``, ``Scalars``), ``WeightNames`` / ``LLAMA_NAMES`` / ``GEMMA_NAMES``,
  ``DecoderLM``; weights: ``open_weights``,
  ``WeightStore``, ``RawTensor``, ``read_gguf_tensors`` / ``GGUFTensors`` (GGUF files that are
  not models, e.g. LoRA adapters) and ``unpermute_rows`` (llama's Q/K row order);
- layers (:mod:`metrale_core.layers`): norms, RoPE, gated MLPs, embedding, the linear layer and
  its weight formats, paged attention, ``torch_dtype``; the LoRA targets a model declares
  (``LoRATargets`` of ``LoRATarget`` / ``LoRAPart``, ``LoRATargetsLM``); MoE routing (``route``, ``Groups``:
  softmax / sigmoid, correction bias, group-limited top-k, scaling); tensor parallelism
  (:mod:`metrale_core.layers.parallel`): ``TensorParallel``, ``ShardedStore`` / ``Shard``,
  ``RowParallelLinear``, ``VocabParallelEmbedding``, ``ParallelHead``, ``split_heads``, ...;
- kernels: ``CustomOp``, the input checks, the CPU-library and CuPy launch helpers;
- sampling: ``PositionKind``, ``ProcessorContext``, ``LogitProcessor``, ``Sampler``,
  ``inverse_cdf``;
- stream parsing: ``TagParserBase`` (the buffer driver of the built-in tool-call parsers),
  ``ToolCallParser``, ``ParsedDelta``, ``CompletedCall``, ``held_back_len``, ``scan_tags``;
- engine protocols: ``SchedulingPolicy`` / ``AdmissionStep`` (scheduler plugins), ``Request`` /
  ``Sequence``, the speculation records (``Draft``, ``StepReport``, ``VerifyRow``,
  ``Speculator``), ``model_device``, and the pieces a side model runs on (``BlockManager``,
  ``ModelRunner``, ``SchedulerOutput``, ``ScheduledChunk``); executors (``ExecutorSpec``,
  ``Rendezvous``, ``run_worker``, ``free_port``: what an executor plugin such as metrale-ray
  starts its workers with).

Invariants:
- Importing this module imports nothing else (no torch): each name is resolved on first access
  through :data:`PUBLIC` (PEP 562 ``__getattr__``) and cached in the module, so a plugin's
  ``__init__`` that only needs specs and ``hookimpl`` stays as light as those modules are.
- The ``if TYPE_CHECKING:`` block imports exactly the names of :data:`PUBLIC` from the same modules
  (``tests/test_public_api.py`` compares them), so mypy and IDEs see real types while run time
  stays lazy.
- Every name in :data:`PUBLIC` resolves (``tests/test_public_api.py`` imports each one); a name
  leaves the table only with a minor version bump (plugins pin ``metrale-core>=0.1,<0.2``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__all__ = ["PUBLIC"]  # extended below with every public name

_REGISTRATION = {
    "metrale_core": ("hookimpl", "__version__"),
    "metrale_core.plugin.components": (
        "ExecutorSpec",
        "KVScaleSourceSpec",
        "LoadOptions",
        "LogitProcessorSpec",
        "ModelLoaderSpec",
        "ProposerSpec",
        "SamplerSpec",
        "SchedulerSpec",
        "ToolCallParserSpec",
    ),
    "metrale_core.plugin.discovery": ("LazyFactory", "lazy_factory", "load_registry"),
    "metrale_core.loading.model_build": ("model_from_store",),
    "metrale_core.errors": (
        "ConfigError",
        "CorruptWeightsFile",
        "InvalidRequest",
        "KVCacheExhausted",
        "MetraleError",
        "MissingWeightsFile",
        "PluginError",
        "ShapeMismatch",
        "WeightsError",
    ),
}
_MODEL = {
    "metrale_core.model_api": (
        "CausalLM",
        "ForwardBatch",
        "KVCodec",
        "KVLayout",
        "ModelInfo",
        "PagedKVCache",
        "PlainKVCodec",
        "RecurrentLayout",
        "gather_blocks",
    ),
    "metrale_core.decoder.spec": (
        "Attention",
        "DecoderSpec",
        "LayerPattern",
        "Mlp",
        "Norms",
        "Scalars",
    ),
    "metrale_core.decoder.names": ("GEMMA_NAMES", "LLAMA_NAMES", "WeightNames"),
    "metrale_core.decoder.model": ("DecoderLM",),
    "metrale_core.weights": ("RawTensor", "WeightStore", "open_weights"),
    "metrale_core.weights.gguf_tensors": ("GGUFTensors", "read_gguf_tensors"),
    "metrale_core.weights.gguf_hf": ("unpermute_rows",),
    "metrale_core.layers": (
        "DTYPES",
        "WEIGHT_FORMATS",
        "WEIGHT_FORMAT_ENV",
        "AttentionPlan",
        "DecoderOps",
        "DenseLinear",
        "Embedding",
        "GeGLU",
        "KVCacheWrite",
        "Linear",
        "PagedAttentionDecode",
        "PagedAttentionPrefill",
        "QKNormRope",
        "RMSNorm",
        "SwiGLU",
        "apply_rope",
        "build_embedding",
        "build_linear",
        "build_tied_head",
        "embed_tokens",
        "geglu",
        "paged_attention",
        "require_weight_format",
        "resolve_weight_format",
        "rms_norm",
        "rope_cos_sin",
        "rope_inv_freq",
        "signed_sin",
        "swiglu",
        "torch_dtype",
        "write_kv",
        "windowed_paged_attention",
    ),
    "metrale_core.layers.lora_targets": ("LoRAPart", "LoRATarget", "LoRATargets", "LoRATargetsLM"),
    "metrale_core.layers.moe": ("Groups", "route"),
    "metrale_core.layers.parallel": (
        "HeadSplit",
        "ParallelHead",
        "RowParallelLinear",
        "Shard",
        "ShardedStore",
        "TensorParallel",
        "VocabParallelEmbedding",
        "split_heads",
        "split_range",
        "split_unit",
    ),
}
_KERNELS = {
    "metrale_core.kernels": (
        "KERNELS_ENV",
        "CustomOp",
        "KernelCompileError",
        "KernelInputError",
        "KernelPath",
        "check_contiguous",
        "check_dtype",
        "check_same_device",
        "check_shape",
        "check_tensor",
        "compile_ptx",
        "compile_runtime_source",
        "cpu_library",
        "cpu_unavailable_reason",
        "cupy_unavailable_reason",
        "find_cu_files",
        "load_raw_module",
        "nvcc_path",
        "ptx_entries",
        "requested_path",
        "select_path",
    ),
    "metrale_core.kernels.cpu": ("cpu_flags",),
    "metrale_core.kernels.cuda": ("f32", "i32", "i64", "ptr", "torch_stream"),
}
_SAMPLING = {
    "metrale_core.sampling.position": ("PositionKind",),
    "metrale_core.sampling.interface": (
        "LogitProcessor",
        "ProcessorContext",
        "RowLike",
        "SampleOutput",
        "Sampler",
        "SamplingError",
    ),
    "metrale_core.sampling.params": ("SamplingParams",),
    "metrale_core.sampling.sampler": ("inverse_cdf",),
    "metrale_core.sampling.structured": ("StructuredOutput", "StructuredOutputError"),
}
_STREAMPARSE = {
    "metrale_core.streamparse.base": (
        "CALL_CLOSE",
        "CALL_OPEN",
        "CompletedCall",
        "ParsedDelta",
        "TagParserBase",
        "ToolCallParser",
        "held_back_len",
        "scan_tags",
    ),
}
_ENGINE = {
    "metrale_core.engine.speculation": ("Draft", "ProposerContext", "Speculator", "StepReport", "VerifyRow"),
    "metrale_core.engine.runner": ("ModelRunner", "model_device"),
    "metrale_core.engine.adapters": ("ADAPTER_EXTRA", "AdapterBank", "AdapterWeights"),
    "metrale_core.layers.lora": ("LoRALinear", "LoRARows", "active_rows", "attach_lora"),
    "metrale_core.engine.block_manager": ("BlockManager",),
    "metrale_core.engine.side_pool": ("SidePool",),
    "metrale_core.engine.scheduler": (
        "AdmissionStep",
        "FcfsPolicy",
        "ScheduledChunk",
        "SchedulerOutput",
        "SchedulingPolicy",
    ),
    "metrale_core.engine.request": ("Request", "Sequence", "SequenceStatus"),
    "metrale_core.parallel.distributed": ("Rendezvous",),
    "metrale_core.parallel.executors": ("free_port",),
    "metrale_core.parallel.worker": ("run_worker",),
}

#: public name -> the module that defines it.
PUBLIC: dict[str, str] = {
    name: module
    for group in (_REGISTRATION, _MODEL, _KERNELS, _SAMPLING, _STREAMPARSE, _ENGINE)
    for module, names in group.items()
    for name in names
}

__all__ += sorted(PUBLIC)

if TYPE_CHECKING:  # the same names for static checkers (a test keeps this block equal to PUBLIC)
    from metrale_core import (
        __version__,
        hookimpl,
    )
    from metrale_core.decoder.model import (
        DecoderLM,
    )
    from metrale_core.decoder.names import (
        GEMMA_NAMES,
        LLAMA_NAMES,
        WeightNames,
    )
    from metrale_core.decoder.spec import (
        Attention,
        DecoderSpec,
        LayerPattern,
        Mlp,
        Norms,
        Scalars,
    )
    from metrale_core.engine.adapters import (
        ADAPTER_EXTRA,
        AdapterBank,
        AdapterWeights,
    )
    from metrale_core.engine.block_manager import (
        BlockManager,
    )
    from metrale_core.engine.request import (
        Request,
        Sequence,
        SequenceStatus,
    )
    from metrale_core.engine.runner import (
        ModelRunner,
        model_device,
    )
    from metrale_core.engine.scheduler import (
        AdmissionStep,
        FcfsPolicy,
        ScheduledChunk,
        SchedulerOutput,
        SchedulingPolicy,
    )
    from metrale_core.engine.side_pool import (
        SidePool,
    )
    from metrale_core.engine.speculation import (
        Draft,
        ProposerContext,
        Speculator,
        StepReport,
        VerifyRow,
    )
    from metrale_core.errors import (
        ConfigError,
        CorruptWeightsFile,
        InvalidRequest,
        KVCacheExhausted,
        MetraleError,
        MissingWeightsFile,
        PluginError,
        ShapeMismatch,
        WeightsError,
    )
    from metrale_core.kernels import (
        KERNELS_ENV,
        CustomOp,
        KernelCompileError,
        KernelInputError,
        KernelPath,
        check_contiguous,
        check_dtype,
        check_same_device,
        check_shape,
        check_tensor,
        compile_ptx,
        compile_runtime_source,
        cpu_library,
        cpu_unavailable_reason,
        cupy_unavailable_reason,
        find_cu_files,
        load_raw_module,
        nvcc_path,
        ptx_entries,
        requested_path,
        select_path,
    )
    from metrale_core.kernels.cpu import (
        cpu_flags,
    )
    from metrale_core.kernels.cuda import (
        f32,
        i32,
        i64,
        ptr,
        torch_stream,
    )
    from metrale_core.layers import (
        DTYPES,
        WEIGHT_FORMAT_ENV,
        WEIGHT_FORMATS,
        AttentionPlan,
        DecoderOps,
        DenseLinear,
        Embedding,
        GeGLU,
        KVCacheWrite,
        Linear,
        PagedAttentionDecode,
        PagedAttentionPrefill,
        QKNormRope,
        RMSNorm,
        SwiGLU,
        apply_rope,
        build_embedding,
        build_linear,
        build_tied_head,
        embed_tokens,
        geglu,
        paged_attention,
        require_weight_format,
        resolve_weight_format,
        rms_norm,
        rope_cos_sin,
        rope_inv_freq,
        signed_sin,
        swiglu,
        torch_dtype,
        windowed_paged_attention,
        write_kv,
    )
    from metrale_core.layers.lora import (
        LoRALinear,
        LoRARows,
        active_rows,
        attach_lora,
    )
    from metrale_core.layers.lora_targets import (
        LoRAPart,
        LoRATarget,
        LoRATargets,
        LoRATargetsLM,
    )
    from metrale_core.layers.moe import Groups, route
    from metrale_core.layers.parallel import (
        HeadSplit,
        ParallelHead,
        RowParallelLinear,
        Shard,
        ShardedStore,
        TensorParallel,
        VocabParallelEmbedding,
        split_heads,
        split_range,
        split_unit,
    )
    from metrale_core.loading.model_build import (
        model_from_store,
    )
    from metrale_core.model_api import (
        CausalLM,
        ForwardBatch,
        KVCodec,
        KVLayout,
        ModelInfo,
        PagedKVCache,
        PlainKVCodec,
        RecurrentLayout,
        gather_blocks,
    )
    from metrale_core.parallel.distributed import Rendezvous
    from metrale_core.parallel.executors import free_port
    from metrale_core.parallel.worker import run_worker
    from metrale_core.plugin.components import (
        ExecutorSpec,
        KVScaleSourceSpec,
        LoadOptions,
        LogitProcessorSpec,
        ModelLoaderSpec,
        ProposerSpec,
        SamplerSpec,
        SchedulerSpec,
        ToolCallParserSpec,
    )
    from metrale_core.plugin.discovery import (
        LazyFactory,
        lazy_factory,
        load_registry,
    )
    from metrale_core.sampling.interface import (
        LogitProcessor,
        ProcessorContext,
        RowLike,
        SampleOutput,
        Sampler,
        SamplingError,
    )
    from metrale_core.sampling.params import (
        SamplingParams,
    )
    from metrale_core.sampling.position import (
        PositionKind,
    )
    from metrale_core.sampling.sampler import (
        inverse_cdf,
    )
    from metrale_core.sampling.structured import (
        StructuredOutput,
        StructuredOutputError,
    )
    from metrale_core.streamparse.base import (
        CALL_CLOSE,
        CALL_OPEN,
        CompletedCall,
        ParsedDelta,
        TagParserBase,
        ToolCallParser,
        held_back_len,
        scan_tags,
    )
    from metrale_core.weights import (
        RawTensor,
        WeightStore,
        open_weights,
    )
    from metrale_core.weights.gguf_hf import (
        unpermute_rows,
    )
    from metrale_core.weights.gguf_tensors import (
        GGUFTensors,
        read_gguf_tensors,
    )


def __getattr__(name: str) -> Any:
    module = PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"metrale_core.api has no public name {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # resolved once
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(PUBLIC))
