"""``met``: the command-line entry point.

Owner: the CLI.  Sub-commands live in their own modules (``generate``, ``plugins_cmd``, ...);
this module builds the parser, configures logging once (stderr only) and turns every
``MetraleError`` into a one-line message with exit code 2 instead of a traceback.

Invariants:
- stdout carries only the command's output (generated text, tables); logs go to stderr.
"""

from __future__ import annotations

import argparse
import os
import sys

import metrale_core
from metrale_core.errors import MetraleError

__all__ = ["build_parser", "main"]


def configure_logging(level: str) -> None:
    """Log to stderr at ``level`` (``metrale_core.logs``, where every sink is set up)."""
    from metrale_core.logs import to_stderr

    to_stderr(level)


def build_parser(registry=None) -> argparse.ArgumentParser:
    from metrale_core.cli import generate

    parser = argparse.ArgumentParser(
        prog="met", description="Metrale: an LLM inference server built as a plugin framework"
    )
    parser.add_argument("--version", action="version", version=f"met {metrale_core.__version__}")
    parser.add_argument(
        "--log-level",
        default=os.environ.get("METRALE_LOG", "warning"),
        choices=("trace", "debug", "info", "success", "warning", "error"),
        help="stderr log level (default: $METRALE_LOG or warning)",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    generate.add_parser(sub, registry)
    _add_plugins_command(sub)
    _add_optional_commands(sub, registry)
    return parser


def _add_plugins_command(sub) -> None:
    cmd = sub.add_parser("plugins", help="list installed plugins and what each registers")
    cmd.add_argument("--json", action="store_true", help="machine-readable output")
    cmd.set_defaults(func=_run_plugins)
    actions = cmd.add_subparsers(dest="plugins_command", metavar="ACTION")
    new = actions.add_parser(
        "new",
        help="create a new plugin distribution from the template",
        description="Write metrale-NAME/ (pyproject, plugin module, tests) into DIR; install it with pip install -e.",
    )
    new.add_argument("name", metavar="NAME", help="plugin name, e.g. top-a (-> metrale-top-a)")
    new.add_argument("--dir", default=".", help="folder to create metrale-NAME/ in (default: .)")
    new.set_defaults(func=_run_plugins_new)


def _run_plugins_new(args, registry) -> int:
    from metrale_core.cli.plugin_template import render_plugin

    target = render_plugin(args.name, args.dir)
    print(f"created {target}; next: pip install -e {target} && python -m pytest {target / 'tests'}")
    return 0


def _run_plugins(args, registry) -> int:
    import json

    from metrale_core.cli.plugins_cmd import format_plugins, plugins_json

    if args.json:
        print(json.dumps(plugins_json(registry), indent=2))
    else:
        print(format_plugins(registry))
    return 0


def _add_optional_commands(sub, registry) -> None:
    """Commands whose modules may be absent in a minimal install (e.g. the server)."""
    from metrale_core.cli import bench_cmd, hub_cmd, replica, worker

    worker.add_parser(sub, registry)
    replica.add_parser(sub, registry)
    hub_cmd.add_parser(sub, registry)
    bench_cmd.add_parser(sub, registry)
    try:
        from metrale_core.cli import serve
    except ImportError:
        return
    serve.add_parser(sub, registry)
    from metrale_core.cli import chat

    chat.add_parser(sub, registry)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    configure_logging(os.environ.get("METRALE_LOG", "warning"))
    try:
        from metrale_core.plugin.discovery import load_registry

        registry = load_registry()
        parser = build_parser(registry)
        args = parser.parse_args(argv)
        configure_logging(args.log_level)
        if not getattr(args, "func", None):
            parser.print_help(sys.stderr)
            return 2
        return int(args.func(args, registry) or 0)
    except MetraleError as exc:
        print(f"met: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("met: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
