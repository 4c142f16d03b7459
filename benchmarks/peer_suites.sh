#!/usr/bin/env bash
# The peers' own loader tests, run with our samplers in place of theirs (issue 30). Fetches nothing: it runs
# whatever of the peers' test files a developer placed under PEER_TESTS (default: ../peer_tests, outside
# the repository), laid out as in their repositories:
#
#   PyG 2.8   (github.com/pyg-team/pytorch_geometric, tag 2.8.0):
#     $PEER_TESTS/pyg/test/conftest.py, test/loader/test_neighbor_loader.py,
#     test/loader/test_link_neighbor_loader.py, test/sampler/test_sampler_neighbor_sampler.py
#   DGL 2.1   (github.com/dmlc/dgl, tag v2.1.0):
#     $PEER_TESTS/dgl/tests/python/pytorch/dataloading/test_dataloader.py, tests/backend/**, tests/utils/**
#   TorchRL 0.14 (github.com/pytorch/rl, commit 6e18e35b2 "Bump 0.14.0"):
#     $PEER_TESTS/torchrl/test/rb/test_samplers.py, test/rb/_rb_common.py (TorchRL's SliceSampler itself:
#     the reference tests/replay/test_torchrl_scenarios.py replays on a trajectory store)
#
# e.g.  git -C pytorch_geometric show 2.8.0:test/loader/test_neighbor_loader.py > $PEER_TESTS/pyg/test/loader/...
# benchmarks/peer/peer_plugin.py makes PyG's NeighborLoader / LinkNeighborLoader / NeighborSampler build
# samplers.PygSampler and DGL's NeighborSampler build samplers.DglSampler; see docs/performance.md
# ("The peers' own test suites") for the counts. Usage: benchmarks/peer_suites.sh [pyg|dgl|torchrl ...]
set -u
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PEER="${PEER_TESTS:-$ROOT/../peer_tests}"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
SUITES="${*:-pyg dgl torchrl}"
export PYTHONPATH="$ROOT/benchmarks/peer:$ROOT${PYTHONPATH:+:$PYTHONPATH}"
status=0

present() {  # the given paths that exist, relative to the current folder
    for f in "$@"; do [ -f "$f" ] && printf '%s ' "$f"; done
}

for suite in $SUITES; do
    case "$suite" in
    pyg)
        dir="$PEER/pyg/test"
        [ -d "$dir" ] || { echo "peer_suites: no PyG tests under $dir (skipped)"; continue; }
        files=$(cd "$dir" && present loader/test_neighbor_loader.py loader/test_link_neighbor_loader.py \
                                     sampler/test_sampler_neighbor_sampler.py)
        echo "== PyG: $files"
        (cd "$dir" && "$PY" -m pytest -p peer_plugin -p no:cacheprovider -q -rfEs $files) || status=1
        ;;
    dgl)
        dir="$PEER/dgl/tests/python/pytorch/dataloading"
        [ -f "$dir/test_dataloader.py" ] || { echo "peer_suites: no DGL tests under $dir (skipped)"; continue; }
        echo "== DGL: test_dataloader.py (the cases DGL's NeighborSampler draws; the Full and Labor samplers stay DGL's)"
        (cd "$dir" && PYTHONPATH="$PYTHONPATH:$PEER/dgl/tests" "$PY" -m pytest -p peer_plugin \
            -p no:cacheprovider -q -rfEs test_dataloader.py \
            -k "(neighbor_nonuniform or node_dataloader or edge_dataloader or worker_init or ddp) and not full and not labor") || status=1
        ;;
    torchrl)
        dir="$PEER/torchrl/test/rb"
        if [ -f "$dir/test_samplers.py" ]; then
            echo "== TorchRL: test_samplers.py's SliceSampler scenarios (TorchRL's sampler, the reference)"
            (cd "$dir" && "$PY" -m pytest -p no:cacheprovider -q -rfE test_samplers.py -k "(slice or Slice or FindStartStop) and not rioritized") \
                || status=1
        fi
        echo "== TorchRL scenarios on our trajectory store (docs/notes/peer-suites.md: which apply, which differ)"
        (cd "$ROOT" && "$PY" -m pytest -p no:cacheprovider -q tests/replay/test_torchrl_scenarios.py \
            tests/replay/test_torchrl_slices.py tests/replay/test_torchrl_keys.py) || status=1
        ;;
    *) echo "peer_suites: unknown suite $suite (pyg, dgl, torchrl)"; status=2 ;;
    esac
done
exit $status
