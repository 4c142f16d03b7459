#!/usr/bin/env bash
# PyG baseline for benchmarks/sampler.py: torch_geometric plus its torch-sparse sampling backend, built from
# source into .venv against the pinned CPU torch. CI does not run this; the benchmark skips PyG without it.
#
# Usage (after scripts/setup.sh; idempotent: a second run only checks):
#   bash benchmarks/setup_pyg.sh            torch-scatter + torch-sparse packages (PyG's NeighborSampler works)
#   bash benchmarks/setup_pyg.sh --op-only  only torch-sparse's neighbor_sample op (2 C++ files) into
#                                           .venv/pyg_ops/; benchmarks/_pyg.py then calls the op directly
#
# - torch is pinned first and passed to every pip call, so no step can swap it for another build.
# - pyg-lib, PyG's preferred backend (and the only one with weighted neighbour sampling, pyg-lib>=0.3.0),
#   is not on PyPI at all (its wheels live on PyG's own index, which this machine cannot reach), so it
#   cannot be built or installed here. torch-sparse 0.6.18 is an sdist on PyPI and compiles here.
# - torch-sparse's Python package imports torch_scatter, so the full build compiles torch-scatter 2.1.2 too.
# - --no-build-isolation: both setup.py files import torch, which must be the installed one.
# Build time: torch-sparse is 12 extensions (24 C++ files against torch's headers, one extension after the
# other; MAX_JOBS only runs the 2 files of one extension together) and torch-scatter 4 more (8 files, one at
# a time). Measured on this 2-core machine (gcc 12, torch 2.13.0+cpu) while other engineers' tests and
# builds kept the load average at 5-23, the two builds running side by side: torch-sparse 89 min wall
# (26 CPU-min), torch-scatter 74 min wall (10 CPU-min); so about 36 CPU-min in all, some 20 min on an idle
# 2-core machine, not the 6 min often quoted. The --op-only build took 558 s wall at load average 9-12,
# 96 s at 2.7. Both compiled cleanly against torch 2.13.0, with no patch.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
TORCH="torch==2.13.0"
SPARSE="torch-sparse==0.6.18"
[ -x "$PY" ] || { echo "no .venv: run scripts/setup.sh first" >&2; exit 1; }
export MAX_JOBS="${MAX_JOBS:-2}" FORCE_ONLY_CPU=1

$PY -m pip install --quiet "$TORCH"
$PY -c "import torch_geometric" 2>/dev/null || $PY -m pip install --quiet "$TORCH" torch_geometric
$PY -c "import setuptools, wheel" 2>/dev/null || $PY -m pip install --quiet "$TORCH" setuptools wheel

build() {  # build <import name> <pip requirement>
  if $PY -c "import $1" 2>/dev/null; then
    echo "$1 already imports: skipped"
    return
  fi
  local start=$SECONDS
  echo "building $2 from source (tens of minutes on 2 cores)..."
  $PY -m pip install --quiet --no-build-isolation --no-binary "${2%%=*}" "$TORCH" "$2"
  echo "$2 built in $((SECONDS - start)) s"
}

build_op() {  # torch-sparse's neighbor_sample op alone, as its setup.py compiles it (less -g), into .venv/pyg_ops
  local dest
  dest="$($PY -c 'import sys; print(sys.prefix)')/pyg_ops"
  if [ -f "$dest/_neighbor_sample_cpu.so" ] && $PY -c "import torch; torch.ops.load_library('$dest/_neighbor_sample_cpu.so'); torch.ops.torch_sparse.neighbor_sample"; then
    echo "$dest/_neighbor_sample_cpu.so already loads: skipped"
    return
  fi
  local start=$SECONDS tmp torch_dir py_inc
  tmp="$(mktemp -d)"
  $PY -m pip download --quiet --no-deps --no-binary torch-sparse --no-build-isolation "$SPARSE" -d "$tmp"
  tar -xzf "$tmp"/torch_sparse-*.tar.gz -C "$tmp"
  torch_dir="$($PY -c 'import torch, os; print(os.path.dirname(torch.__file__))')"
  py_inc="$($PY -c 'import sysconfig; print(sysconfig.get_paths()["include"])')"
  local src=("$tmp"/torch_sparse-*/)
  local flags=(-O3 -fPIC -std=c++20 -fopenmp -DAT_PARALLEL_OPENMP -DWITH_PYTHON -DTORCH_API_INCLUDE_EXTENSION_H
               -DTORCH_EXTENSION_NAME=_neighbor_sample_cpu -Wno-sign-compare -I"${src[0]}csrc"
               -I"${src[0]}third_party/parallel-hashmap" -I"$torch_dir/include"
               -I"$torch_dir/include/torch/csrc/api/include" -I"$py_inc")
  echo "compiling torch-sparse's neighbor_sample op (2 files)..."
  c++ "${flags[@]}" -c "${src[0]}csrc/cpu/neighbor_sample_cpu.cpp" -o "$tmp/a.o" &
  c++ "${flags[@]}" -c "${src[0]}csrc/neighbor_sample.cpp" -o "$tmp/b.o"
  wait
  mkdir -p "$dest"
  c++ -shared -s "$tmp/a.o" "$tmp/b.o" -L"$torch_dir/lib" -lc10 -ltorch -ltorch_cpu -ltorch_python \
      -o "$dest/_neighbor_sample_cpu.so"
  echo "${SPARSE#*==}" > "$dest/VERSION"
  rm -rf "$tmp"
  echo "neighbor_sample op built in $((SECONDS - start)) s: $dest/_neighbor_sample_cpu.so"
}

if [ "${1:-}" = "--op-only" ]; then
  build_op
else
  build torch_scatter "torch-scatter==2.1.2"
  build torch_sparse "$SPARSE"
fi

$PY - <<'EOF'
import sys
from pathlib import Path

import torch
assert torch.__version__ == "2.13.0+cpu", f"torch changed to {torch.__version__}"
import torch_geometric
import torch_geometric.typing as t
op = Path(sys.prefix) / "pyg_ops" / "_neighbor_sample_cpu.so"
if t.WITH_TORCH_SPARSE or t.WITH_PYG_LIB:
    backend = "torch-sparse package" if t.WITH_TORCH_SPARSE else "pyg-lib"
else:
    torch.ops.load_library(str(op))
    torch.ops.torch_sparse.neighbor_sample  # raises if the op did not register
    backend = f"torch-sparse neighbor_sample op alone ({op})"
print(f"torch {torch.__version__}, torch_geometric {torch_geometric.__version__}, backend: {backend}, "
      f"weighted neighbour sampling: {t.WITH_WEIGHTED_NEIGHBOR_SAMPLE}")
EOF
