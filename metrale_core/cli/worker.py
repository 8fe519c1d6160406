"""``met worker``: one rank above 0 of a tensor-parallel job started by hand or by torchrun.

Owner: the CLI.  Rank 0 is ``met serve`` / ``met generate --distributed-executor-backend env``
with the same ``MASTER_ADDR`` / ``MASTER_PORT`` / ``WORLD_SIZE``; this process joins as
``$RANK``, learns from rank 0 what to load, loads its shard and runs every step rank 0 sends
(``metrale_core.parallel.worker``).

Invariants: the worker takes no model flags (rank 0 sends them); it exits 0 when rank 0 stops
the job and non-zero when the job fails or rank 0 is gone.
"""

from __future__ import annotations

import argparse
import os

__all__ = ["add_parser", "run"]


def add_parser(sub, registry) -> argparse.ArgumentParser:
    cmd = sub.add_parser(
        "worker",
        help="run one rank of a tensor-parallel job (torchrun / multi-machine)",
        description="Join the tensor-parallel job of MASTER_ADDR:MASTER_PORT as RANK of WORLD_SIZE "
        "(torch.distributed's variables, as torchrun sets them); 'met serve "
        "--tensor-parallel-size WORLD_SIZE --distributed-executor-backend env' is rank 0.",
    )
    cmd.add_argument(
        "--device",
        default=None,
        help="this rank's device kind when rank 0 runs on CUDA (cuda: cuda:$LOCAL_RANK; "
        "default: $METRALE_TP_DEVICE or cpu)",
    )
    cmd.set_defaults(func=run)
    return cmd


def run(args, registry) -> int:
    from metrale_core.parallel.worker import run_worker

    if args.device:
        os.environ["METRALE_TP_DEVICE"] = args.device
    return run_worker(registry=registry)
