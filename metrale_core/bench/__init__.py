"""``met bench``'s building blocks: the lean SSE client, the statistics, the load generator, the
in-process pp/tg tests and the report.

Owner: ``metrale_core.cli.bench_cmd`` (``met bench serve`` / ``met bench engine``) and the scripts
under ``bench/`` (which import the client and statistics from here rather than keep copies).

Invariants: importing this package imports none of its modules (each is imported where used), so
``met``'s start-up pays for none of them; nothing here is part of the plugin API
(``metrale_core.api``).
"""
