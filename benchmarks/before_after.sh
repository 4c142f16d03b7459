#!/usr/bin/env bash
# Interleaved before/after runs of the sampler, replay, features and full_graph benchmarks: an older commit
# (checked out in a temporary worktree) against this tree, ROUNDS times each, alternating, with the load printed
# before each run. Usage: bash benchmarks/before_after.sh OLD_COMMIT [ROUNDS] [OUT_DIR]
# Results: OUT_DIR/NAME-{old,new}-ROUND.json (and .txt), default benchmarks/results/before_after/.
set -u
old_commit=${1:?usage: before_after.sh OLD_COMMIT [ROUNDS] [OUT_DIR]}
rounds=${2:-2}
here=$(cd "$(dirname "$0")/.." && pwd)
out=${3:-$here/benchmarks/results/before_after}
py=${PYTHON:-$here/.venv/bin/python}
mkdir -p "$out"
old_tree=$(mktemp -d)/old
git -C "$here" worktree add -q --detach "$old_tree" "$old_commit" || exit 1
trap 'git -C "$here" worktree remove --force "$old_tree"' EXIT
export GRAPHRL_DATA="${GRAPHRL_DATA:-$(cd "$here/.." && pwd)/shared/data}"
for r in $(seq 1 "$rounds"); do
  for side in old new; do
    dir=$here; [ "$side" = old ] && dir=$old_tree
    echo "== round $r $side load $(cut -d' ' -f1-3 /proc/loadavg) $(date +%T)"
    cd "$dir" || exit 1
    PYTHONPATH=$dir $py benchmarks/sampler.py --graphs gowalla --batches 8 --repeats 2 \
      --output "$out/sampler-$side-$r.json" > "$out/sampler-$side-$r.txt" 2>&1
    PYTHONPATH=$dir $py benchmarks/replay.py --small-steps 200000 --image-steps 8000 --iters 5 --repeats 2 \
      --output "$out/replay-$side-$r.json" > "$out/replay-$side-$r.txt" 2>&1
    PYTHONPATH=$dir $py benchmarks/features.py --rows 500000 --repeats 5 --batch 50000 \
      --output "$out/features-$side-$r.json" > "$out/features-$side-$r.txt" 2>&1
    PYTHONPATH=$dir $py benchmarks/full_graph.py --scale 0.01 --epochs 3 --memory-epochs 1 \
      --output "$out/full_graph-$side-$r.json" > "$out/full_graph-$side-$r.txt" 2>&1
  done
done
echo "== done load $(cut -d' ' -f1-3 /proc/loadavg) $(date +%T); results in $out"
