"""Every kernel source and template a package reads at run time is declared as package data, so a
wheel (not only an editable install) carries it: a missing ``.c`` file would silently drop the CPU
kernels, a missing ``.cu`` the CUDA ones, a missing ``.pyi`` the static view of ``metrale_core.api``."""

from __future__ import annotations

import fnmatch
from pathlib import Path

import pytest
import tomllib

REPO = Path(__file__).resolve().parents[1]
PROJECTS = [
    REPO,
    *sorted(
        p for folder in ("plugins", "contrib") for p in (REPO / folder).iterdir() if (p / "pyproject.toml").is_file()
    ),
]
DATA_SUFFIXES = {".cu", ".cuh", ".c", ".h", ".jinja", ".pyi"}


def _package_data(project: Path) -> tuple[list[Path], dict[str, list[str]]]:
    config = tomllib.loads((project / "pyproject.toml").read_text())["tool"]["setuptools"]
    patterns = config.get("package-data", {})
    listed = config.get("packages", {})  # a list of names, or {"find": {"include": [...]}}
    includes = listed if isinstance(listed, list) else listed.get("find", {}).get("include", ["*"])
    packages = [
        p
        for p in project.iterdir()
        if (p / "__init__.py").is_file() and any(fnmatch.fnmatch(p.name, i) for i in includes)
    ]
    return packages, patterns


def _glob_match(rel: str, pattern: str) -> bool:
    """setuptools' package-data glob: ``*`` stays within one path component."""
    parts, want = rel.split("/"), pattern.split("/")
    return len(parts) == len(want) and all(fnmatch.fnmatch(a, b) for a, b in zip(parts, want))


def _covered(path: Path, top: Path, patterns: dict[str, list[str]]) -> bool:
    """A pattern keyed by a package (or ``*``: every package) is relative to that package's
    directory; any enclosing package of ``path`` may declare it."""
    package = path.parent
    while True:
        if (package / "__init__.py").is_file():
            name = ".".join(package.relative_to(top.parent).parts)
            rel = path.relative_to(package).as_posix()
            if any(_glob_match(rel, g) for g in patterns.get("*", []) + patterns.get(name, [])):
                return True
        if package == top:
            return False
        package = package.parent


@pytest.mark.parametrize("project", PROJECTS, ids=lambda p: p.name)
def test_kernel_sources_and_templates_are_package_data(project):
    packages, patterns = _package_data(project)
    assert packages, f"{project}: no package found"
    for package in packages:
        for path in package.rglob("*"):
            if path.suffix in DATA_SUFFIXES and "__pycache__" not in path.parts:
                assert _covered(path, package, patterns), (
                    f"{path.relative_to(project)} is not in {project.name}'s package-data {patterns}"
                )
