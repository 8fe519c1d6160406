"""One source of truth for every C entry point's signature: the package's ``kernels/cpu/*.h``.

For every package of the tree that ships C CPU kernels and every ISA variant (built here whether
or not this CPU can run it -- building needs only the compiler):
- the library exports exactly the functions its headers declare (less those a header marks
  ``avx512 only`` in the other variants), so no entry point goes unbound;
- the ctypes signature of each export is the one parsed from the header;
- the definitions in the ``.c`` files, parsed the same way, equal the header's declarations;
- no Python module outside ``metrale_core.kernels.cpu`` writes ``argtypes`` by hand;
and a header edited on one side only (here: the header) breaks the build.
"""

from __future__ import annotations

import ctypes
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from metrale_core.kernels import cpu as cpu_mod
from metrale_core.kernels.cpu import CPU_VARIANTS, bind_prototypes, build_cpu_library, compiler, parse_prototypes
from metrale_core.testing.requires import missing

REPO = Path(__file__).resolve().parents[2]


def _ours(path: Path) -> bool:
    """Not under a hidden directory (virtual environments: .venv, .venv-bench; .tox; .git)."""
    return not any(part.startswith(".") for part in path.relative_to(REPO).parts)


KERNEL_DIRS = sorted({p.parent for p in REPO.glob("**/kernels/cpu/*.c") if _ours(p)})
# a top-level, non-static function definition: optional attributes, return type, name, (args) {
DEFINITION = re.compile(
    r"^(?:__attribute__\(\(.*?\)\)\s*)?(?P<ret>(?:[A-Za-z_]\w*[\s*]+)+?)(?P<name>[A-Za-z_]\w*)"
    r"\((?P<args>[^;{}]*?)\)\s*\{",
    re.M | re.S,
)


def _variant_only(header_text: str) -> set[str]:
    """Functions a header marks ``/* avx512 only */``."""
    return set(re.findall(r"\b([A-Za-z_]\w*)\s*\([^;]*\)\s*;\s*/\*\s*avx512 only", header_text, re.S))


@pytest.fixture(scope="module")
def cc():
    if cpu_mod.platform.machine().lower() not in ("x86_64", "amd64"):
        pytest.skip("the C kernels are x86-64 only")
    if compiler() is None:
        missing("no C compiler")
    return compiler()


def test_the_tree_has_c_kernels_with_headers():
    assert KERNEL_DIRS, "no kernels/cpu/*.c found"
    for d in KERNEL_DIRS:
        assert list(d.glob("*.h")), f"{d} declares no entry points (add a header)"


@pytest.mark.parametrize("isa", list(CPU_VARIANTS))
@pytest.mark.parametrize("kernel_dir", KERNEL_DIRS, ids=lambda d: d.parent.parent.name)
def test_every_export_is_declared_and_bound_from_its_header(kernel_dir, isa, cc, tmp_path):
    headers = sorted(kernel_dir.glob("*.h"))
    declared = parse_prototypes(headers)
    only_avx512 = set().union(*(_variant_only(h.read_text()) for h in headers))
    lib_path = build_cpu_library(sorted(kernel_dir.glob("*.c")), "sig", tmp_path, isa=isa)
    nm = subprocess.run(["nm", "-D", "--defined-only", str(lib_path)], capture_output=True, text=True, check=True)
    exported = {line.split()[-1] for line in nm.stdout.splitlines() if line.split()[1] == "T"}
    expected = set(declared) - (only_avx512 if isa != "avx512" else set())
    assert exported == expected, (
        f"{isa}: exported but undeclared {exported - expected}, declared but missing {expected - exported}"
    )
    lib = ctypes.CDLL(str(lib_path))  # loading runs no ISA-specific code
    bind_prototypes(lib, headers)
    for name in exported:
        restype, argtypes = declared[name]
        fn = getattr(lib, name)
        assert fn.restype is restype and tuple(fn.argtypes) == argtypes, name


@pytest.mark.parametrize("kernel_dir", KERNEL_DIRS, ids=lambda d: d.parent.parent.name)
def test_c_definitions_equal_the_header_declarations(kernel_dir, tmp_path):
    declared = parse_prototypes(sorted(kernel_dir.glob("*.h")))
    seen: dict[str, tuple] = {}
    for source in sorted(kernel_dir.glob("*.c")):
        text = re.sub(r"/\*.*?\*/|//[^\n]*", " ", source.read_text(), flags=re.S)
        for m in DEFINITION.finditer(text):
            ret = m["ret"].strip()
            if ret.split()[0] in ("static", "return", "else", "if", "for", "while", "switch", "do", "typedef"):
                continue
            one = tmp_path / f"{m['name']}.h"
            one.write_text(f"{ret} {m['name']}({m['args']});\n")
            seen[m["name"]] = parse_prototypes([one])[m["name"]]
    assert set(seen) == set(declared), f"defined {sorted(seen)} vs declared {sorted(declared)}"
    for name, signature in seen.items():
        assert signature == declared[name], f"{name}: the definition differs from its declaration"


def test_a_header_edited_on_one_side_only_breaks_the_build(cc, tmp_path):
    kernel_dir = KERNEL_DIRS[0]
    copy = tmp_path / "cpu"
    shutil.copytree(kernel_dir, copy)
    header = next(h for h in sorted(copy.glob("*.h")) if parse_prototypes([h]))
    name, (_restype, _argtypes) = next(iter(parse_prototypes([header]).items()))
    text = header.read_text()
    # the first declared int parameter becomes a double: the C definitions no longer match
    edited = re.sub(rf"({name}\s*\([^;]*?)\bint\b", r"\1double", text, count=1, flags=re.S)
    assert edited != text
    header.write_text(edited)
    with pytest.raises(RuntimeError, match="conflicting types"):
        build_cpu_library(sorted(copy.glob("*.c")), "edited", tmp_path / "out", isa="avx2")


def test_no_module_writes_ctypes_signatures_by_hand():
    offenders = []
    for path in REPO.glob("**/*.py"):
        if not _ours(path) or "tests" in path.parts or (path.name == "cpu.py" and path.parent.name == "kernels"):
            continue
        if re.search(r"\.(argtypes|restype)\s*=", path.read_text(errors="replace")):
            offenders.append(str(path.relative_to(REPO)))
    assert not offenders, f"ctypes signatures written by hand in {offenders}: declare them in a kernels/cpu/*.h"
