"""The engine: scheduler, KV block manager, model runner, output processor and the loops.

``LLMEngine`` is the synchronous engine (``add_request`` / ``step`` / ``abort``); ``AsyncEngine``
runs one on its own thread and streams ``RequestOutput`` deltas to asyncio consumers.  A step is
schedule (``Scheduler``, pure CPU) -> execute (``ModelRunner``, the device) -> update
(``OutputProcessor``: logit pipeline, sampler, detokenizer, stop rules).
"""

from __future__ import annotations

from metrale_core.engine.async_engine import AsyncEngine, EngineStopped
from metrale_core.engine.block_manager import BlockManager
from metrale_core.engine.config import EngineConfig
from metrale_core.engine.deltas import RequestOutput
from metrale_core.engine.engine import EngineStats, LLMEngine, build_pipeline
from metrale_core.engine.output import OutputProcessor
from metrale_core.engine.plan import ScheduledChunk, SchedulerOutput
from metrale_core.engine.policy import AdmissionStep, FcfsPolicy, SchedulingPolicy
from metrale_core.engine.request import Request, Sequence, SequenceStatus
from metrale_core.engine.runner import ModelRunner
from metrale_core.engine.scheduler import Scheduler
from metrale_core.engine.state_slots import StateSlots

__all__ = [
    "AdmissionStep",
    "AsyncEngine",
    "BlockManager",
    "EngineConfig",
    "EngineStats",
    "EngineStopped",
    "FcfsPolicy",
    "LLMEngine",
    "ModelRunner",
    "OutputProcessor",
    "Request",
    "RequestOutput",
    "ScheduledChunk",
    "Scheduler",
    "SchedulerOutput",
    "SchedulingPolicy",
    "Sequence",
    "SequenceStatus",
    "StateSlots",
    "build_pipeline",
]
