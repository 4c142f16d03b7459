#!/usr/bin/env bash
# Create .venv and install graphrl into it. Usage: bash scripts/setup.sh [extras]   e.g. "test,dgl"
# torch is pinned first: an unpinned torch (or a range admitting a newer release) pulls a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-}"
python3 -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet "torch==2.13.0"
if [ -n "$extras" ]; then
  .venv/bin/python -m pip install --quiet "torch==2.13.0" -e ".[${extras}]"
else
  .venv/bin/python -m pip install --quiet "torch==2.13.0" -e .
fi
