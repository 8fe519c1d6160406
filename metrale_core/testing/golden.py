"""Golden-trace files: compare a text with ``<dir>/<name>.trace`` or (re)write it.

Owner: the ``golden`` pytest fixture (metrale_core.testing.pytest_plugin) and anyone comparing
traces outside pytest.
Invariants: a trace file always ends with exactly one newline; comparison is exact (byte for
byte after that normalisation); a mismatch names the file and shows a unified diff, and the fix
(``--update-goldens``) in its message.
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path

from attrs import frozen

__all__ = ["GoldenMismatch", "GoldenStore"]

_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


class GoldenMismatch(AssertionError):
    """A text differs from its checked-in golden trace (or the golden is missing)."""


@frozen
class GoldenStore:
    """A directory of ``*.trace`` files; ``update=True`` writes instead of comparing."""

    directory: Path
    update: bool = False

    def path(self, name: str) -> Path:
        if not _NAME.match(name):
            raise ValueError(f"golden name {name!r} must be letters, digits, '_', '-' or '.'")
        return self.directory / f"{name}.trace"

    def __call__(self, name: str, text: str) -> None:
        """Compare ``text`` with the golden ``name`` (or write it when updating)."""
        path = self.path(name)
        text = text.rstrip("\n") + "\n"
        if self.update:
            path.parent.mkdir(parents=True, exist_ok=True)
            if not path.exists() or path.read_text() != text:
                path.write_text(text)
            return
        if not path.exists():
            raise GoldenMismatch(
                f"golden trace {path} does not exist; run pytest with "
                "--update-goldens to create it, then read and check it in"
            )
        expected = path.read_text()
        if expected == text:
            return
        diff = "".join(
            difflib.unified_diff(
                expected.splitlines(keepends=True),
                text.splitlines(keepends=True),
                fromfile=str(path),
                tofile=f"{name} (this run)",
            )
        )
        raise GoldenMismatch(
            f"trace differs from golden {path} (if the change is intended, rerun with "
            f"--update-goldens and review the diff):\n{diff}"
        )
