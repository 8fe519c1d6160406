"""The C CPU libraries share torch's OpenMP runtime: one ``libgomp`` in the process, one set of
thread-count settings (the claim of ``metrale_core.kernels.cpu``'s docstring).

Each check runs in a fresh interpreter, so what is mapped is what loading torch and one C library
maps -- nothing an earlier test loaded.  The library is a package built for the test: it asks
OpenMP, from C, how many threads a parallel region gets and which runtime answers.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from metrale_core.kernels import cpu as cpu_mod
from metrale_core.kernels.cpu import compiler
from metrale_core.testing.requires import missing

PROBE_C = r"""
#include <omp.h>
#include "metrale_cpu_math.h"
/* omp_get_max_threads() of the calling thread, and the team size a parallel region really gets */
int probe_max_threads(void) { return omp_get_max_threads(); }
int probe_team_size(void) {
    int n = 0;
#pragma omp parallel
    {
#pragma omp single
        n = omp_get_num_threads();
    }
    return n;
}
"""

CHILD = textwrap.dedent("""
    import json, sys
    import torch
    sys.path.insert(0, sys.argv[1])
    from metrale_core.kernels.cpu import cpu_library, cpu_unavailable_reason
    torch.set_num_threads(3)               # differs from OMP_NUM_THREADS=2 below
    torch.randn(256, 256) @ torch.randn(256, 256)   # torch's pool is up
    lib = cpu_library("metrale_omp_probe")
    if lib is None:
        print(json.dumps({"error": cpu_unavailable_reason("metrale_omp_probe")}))
        raise SystemExit
    result = {"c_max": lib.probe_max_threads(), "c_team": lib.probe_team_size(),
              "torch": torch.get_num_threads()}
    gomp = set()
    for line in open("/proc/self/maps"):
        path = line.split()[-1]
        if "libgomp" in path or "libiomp" in path or "libomp" in path:
            gomp.add(path)
    result["runtimes"] = sorted(gomp)
    print(json.dumps(result))
""")


@pytest.fixture
def probe_package(tmp_path):
    if not cpu_mod.cpu_capable():
        pytest.skip("needs an x86-64 CPU with AVX2+FMA+F16C")
    if compiler() is None:
        missing("no C compiler on a CPU that runs the C kernels")
    pkg = tmp_path / "src" / "metrale_omp_probe"
    (pkg / "kernels" / "cpu").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "kernels" / "cpu" / "probe.c").write_text(PROBE_C)
    (pkg / "kernels" / "cpu" / "probe.h").write_text("int probe_max_threads(void);\nint probe_team_size(void);\n")
    return tmp_path


def test_c_kernels_and_torch_share_one_openmp_runtime_and_its_thread_count(probe_package):
    env = {**os.environ, "OMP_NUM_THREADS": "2", "METRALE_CACHE_DIR": str(probe_package / "cache")}
    env.pop(cpu_mod.CPU_ISA_ENV, None)
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(probe_package / "src")], capture_output=True, text=True, env=env, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "error" not in result, result
    # one OpenMP runtime mapped: torch's (the library's NEEDED libgomp.so.1 resolved to it)
    assert len(result["runtimes"]) == 1, result["runtimes"]
    # torch.set_num_threads(3) set the ICV the C code reads: one runtime, one setting
    assert result["torch"] == 3
    assert result["c_max"] == 3 and result["c_team"] == 3, result
