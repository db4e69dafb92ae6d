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
.venv/bin/python -m pip install -q -e ".[dev]"
.venv/bin/python -c "import torch, torchvision, av, lightning; print('torch', torch.__version__, '| torchvision', torchvision.__version__, '| av', av.__version__, '| lightning', lightning.__version__)"
if [ "${TORCH_SPDL_SKIP_DEMO:-0}" != "1" ]; then
  .venv/bin/python benchmarks/run.py --quick --out out/report
fi
