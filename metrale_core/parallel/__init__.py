"""Tensor parallelism across processes: executors place the ranks, rank 0 drives them.

Owner: ``metrale_core.parallel``.  ``met serve`` / ``met generate`` with
``--tensor-parallel-size N`` call :func:`metrale_core.parallel.launch.load_parallel`, which asks the
executor named by ``--distributed-executor-backend`` (the ``metrale_executors`` hook family:
``uni``, ``mp``, ``env`` built in, ``ray`` in the ``metrale-ray`` plugin) to start ranks
1..N-1, joins them in a ``torch.distributed`` group (gloo on CPU, NCCL on CUDA), and loads rank
0's shard.  The engine on rank 0 keeps the one scheduler; every forward of the model
(:class:`~metrale_core.parallel.driver.DriverModel`) first broadcasts the step's ``ForwardBatch``
to the workers (:mod:`metrale_core.parallel.worker`), which run their shard of the same forward
and keep their shard of the KV cache.

Modules: ``distributed`` (rendezvous and groups), ``driver`` (rank 0), ``worker`` (ranks > 0),
``executors`` (the built-in executors), ``launch`` (what the CLI calls).

Invariants: nothing here is imported unless tensor parallelism is asked for (``uni`` with one
rank never imports ``torch.distributed``).
"""
