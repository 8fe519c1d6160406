"""``met replica --connect HOST:PORT``: one data-parallel replica on another host.

Owner: the CLI.  The front is ``met serve --data-parallel-size N --data-parallel-size-local L
--data-parallel-address HOST:PORT`` on another machine; this process connects to it, proves it
holds the shared key (``$METRALE_REPLICA_KEY``), builds the engine the front describes and serves
it (``metrale_core.dataparallel.remote``).

Invariants: the replica takes no model flags (the front sends them, so the model path or hub
name must resolve on this host too); it exits 0 when the front stops it and 1 when the front is
lost (its link closed or silent for the front's ``--distributed-timeout``).
"""

from __future__ import annotations

import argparse

__all__ = ["add_parser", "run"]


def add_parser(sub, registry) -> argparse.ArgumentParser:
    cmd = sub.add_parser(
        "replica",
        help="run one data-parallel replica for a 'met serve' on another host",
        description="Connect to the data-parallel front at HOST:PORT ('met serve ... "
        "--data-parallel-address HOST:PORT'), build the engine it sends and serve its requests. "
        "Both hosts need the same $METRALE_REPLICA_KEY.",
    )
    cmd.add_argument("--connect", required=True, metavar="HOST:PORT", help="the front's --data-parallel-address")
    cmd.add_argument(
        "--connect-timeout",
        type=float,
        default=600.0,
        metavar="SECONDS",
        help="keep trying to reach the front this long (default: 600)",
    )
    cmd.set_defaults(func=run)
    return cmd


def run(args, registry) -> int:
    from metrale_core.dataparallel.remote import parse_address, run_remote_replica

    return run_remote_replica(parse_address(args.connect), args.connect_timeout)
