#!/usr/bin/env bash
# Prepare the one-shot GPU check (benchmarks/gpu_check.py) for a lent GPU machine, then print the exact
# device command. Usage, from anywhere in the checkout:  bash scripts/gpu_prep.sh
#
# The lent machine (Python 3.12, torch, numba with numba-cuda, no network) lacks what the repository needs:
# its numpy 2.5 breaks numba-cuda's import, zarr and gymnasium are missing, and the real data is not there.
# This script, here (where pip reaches the package index):
#   1. downloads the cp312 manylinux x86-64 wheels (no dependencies resolved: each one needed is named) into
#      .whl/ (numpy 2.4.6 shadows the image's numpy; about 19 MiB);
#   2. copies $GRAPHRL_DATA/cora_citeseer (default ../shared/data, the gpu tests' Planetoid data) into
#      .gpudata/;
#   3. writes the commit and `git status --short` into .gpudata/source.json (the copy that travels has no
#      .git; gpu_check.py records it in its JSON);
#   4. adds /.whl/ and /.gpudata/ to git's info/exclude (never committed; they travel as `carry`);
#   5. prints the device tool's `run` arguments (command, carry, timeout_s) and what would travel.
# Rerun it right before the device run: the working tree travels as it is then, source.json should match.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"

PYTHON="${PYTHON:-python3}"
DATA="${GRAPHRL_DATA:-$(cd .. && pwd)/shared/data}"
WHEELS=(numpy==2.4.6 zarr==3.1.6 numcodecs==0.17.1 donfig==0.8.1.post1 google-crc32c==1.9.0
        gymnasium==1.4.0 farama-notifications==0.0.6)

exclude="$(git rev-parse --git-path info/exclude)"
mkdir -p "$(dirname "$exclude")"
touch "$exclude"
for path in /.whl/ /.gpudata/; do
  grep -qxF "$path" "$exclude" || echo "$path" >> "$exclude"
done

# 1. wheels: one version of each (two stop the install on the machine)
mkdir -p .whl
rm -f .whl/*.whl
"$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl "${WHEELS[@]}"
count=$(find .whl -type f -name '*.whl' | wc -l)
if [ "$count" -ne "${#WHEELS[@]}" ]; then
  echo "gpu_prep: expected ${#WHEELS[@]} wheels in .whl, found $count" >&2
  exit 1
fi

# 2. data: the gpu tests' cora and citeseer (1.6 MiB)
if [ ! -d "$DATA/cora_citeseer" ]; then
  echo "gpu_prep: $DATA/cora_citeseer not found: set GRAPHRL_DATA to the shared data folder" >&2
  exit 1
fi
rm -rf .gpudata
mkdir -p .gpudata
cp -r "$DATA/cora_citeseer" .gpudata/

# 3. the source of this run
git status --short > .gpudata/status.txt
"$PYTHON" - "$(git rev-parse HEAD)" <<'EOF'
import datetime, json, pathlib, sys
status = pathlib.Path(".gpudata/status.txt")
source = {"commit": sys.argv[1], "status": status.read_text().splitlines(),
          "prepared_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")}
pathlib.Path(".gpudata/source.json").write_text(json.dumps(source, indent=1) + "\n")
status.unlink()
EOF

# 5. what travels (tracked and untracked-not-ignored files, plus the carried folders): at most 64 MiB
tree=$(git ls-files -z --cached --others --exclude-standard | du -cb --files0-from=- 2>/dev/null | tail -1 | cut -f1)
carried=$(du -cb .whl .gpudata | tail -1 | cut -f1)
total=$(( (tree + carried) / 1048576 ))
echo "gpu_prep: commit $(git rev-parse --short HEAD), $(wc -l < <(git status --short)) changed paths;" \
     "the working tree ${tree} B + carried ${carried} B = ${total} MiB (limit 64 MiB)"
if [ "$total" -ge 64 ]; then
  echo "gpu_prep: too much would travel" >&2
  exit 1
fi

# the device command: install the wheels (numpy first on the path), check the imports, then the check
# under a timeout that sends SIGTERM (gpu_check prints its table and writes its JSON) 15 s before a kill
cmd='set -o pipefail; python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 3; export PYTHONPATH=/tmp/site:$PWD GRAPHRL_DATA=$PWD/.gpudata PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0; python3 -c '"'"'import numpy,zarr,gymnasium;print("numpy",numpy.__version__,"zarr",zarr.__version__)'"'"' 2>&1 | tee $OUT/env.txt || exit 4; nvidia-smi -L 2>&1 | tee -a $OUT/env.txt; timeout -k 15 -s TERM 560 python3 benchmarks/gpu_check.py --output $OUT/gpu_check.json 2>&1 | tee $OUT/gpu_check.log'
"$PYTHON" - "$cmd" <<'EOF'
import json, sys
cmd = sys.argv[1]
assert len(cmd) <= 2000, len(cmd)
print(f"\nThe device tool's run arguments ({len(cmd)} characters of command):\n")
print(json.dumps({"command": cmd, "carry": [".whl", ".gpudata"], "timeout_s": 600}, indent=1))
EOF
