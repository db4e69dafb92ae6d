#!/usr/bin/env bash
# Set up a fresh machine (a virtual environment in .venv with the package and its dev tools)
# and run the main job: the quick benchmark report against torch's DataLoader (1-2 minutes
# on 2 cores; it writes out/report/REPORT.md and its plots, untracked: the committed full
# report in benchmarks/report/ stays as it is).
# Set TORCH_SPDL_SKIP_DEMO=1 to set up only.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
# --no-compile: no byte-compiling of the ~13,000 modules installed (minutes on a slow
# machine). The check below imports what the package, its tests and its benchmarks start
# every process with, and keeps their bytecode: only those are compiled, once. It writes
# the bytecode even where PYTHONDONTWRITEBYTECODE is set (as on the machines this was
# built on), or every new interpreter would compile torch's modules afresh: `import torch`
# took 592-674 s from source against 236-276 s with bytecode on one slow day here (about 3 s
# with bytecode on a quiet one).
# ray: the optional extra for worker_type="ray" (its tests run in the suite, in a network
# namespace of their own: docs/distributed.md)
.venv/bin/python -m pip install -q --no-compile -e ".[dev,ray]"
env -u PYTHONDONTWRITEBYTECODE .venv/bin/python -c "
import torch, torchvision, av, lightning, matplotlib.pyplot
import torch_spdl, torch_spdl.data, torch_spdl.io, torch_spdl.lightning
import torch_spdl.migration, torch_spdl.streaming, torch_spdl.ray_local, ray
print('torch', torch.__version__, '| torchvision', torchvision.__version__, '| av', av.__version__, '| lightning', lightning.__version__)"
if [ "${TORCH_SPDL_SKIP_DEMO:-0}" != "1" ]; then
  .venv/bin/python benchmarks/run.py --quick --out out/report
fi
