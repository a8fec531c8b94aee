#!/usr/bin/env bash
# A/B timing of the working tree against an earlier commit on one GPU machine: builds `qsdpa` for
# both (in parallel, sm_90a), then runs the given bench flags for each, interleaved, ROUNDS times.
# Usage: scripts/gpu_ab.sh OUTDIR COMMIT ROUNDS 'bench flags' ['bench flags' ...]
# COMMIT may also be a tar file of the other tree, for a commit the device machine's copy of .git
# does not hold: on the development machine `git archive -o .ab-old.tar COMMIT`, then pass
# .ab-old.tar (git-ignored: name it in the device run's carry list).
set -uo pipefail
out="${1:?OUTDIR}" commit="${2:?COMMIT}" rounds="${3:?ROUNDS}"
shift 3
mkdir -p "$out"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
deps_flag=()
[ -d "$root/.deps" ] && deps_flag=(-DQSDPA_DEPS_DIR="$root/.deps")
old=/tmp/qsdpa-ab-old
rm -rf "$old"
if [ -f "$commit" ]; then  # a tar of the other tree (git archive)
  git worktree prune >/dev/null 2>&1
  mkdir -p "$old" && tar -xf "$commit" -C "$old" >"$out/ab.log" 2>&1 || { echo "tar failed" | tee -a "$out/ab.log"; exit 1; }
else
  git worktree add -f "$old" "$commit" >"$out/ab.log" 2>&1 || { echo "worktree failed" | tee -a "$out/ab.log"; exit 1; }
fi
[ -d "$root/.deps" ] && ln -s "$root/.deps" "$old/.deps"
jobs=$(( $(nproc) / 2 ))
for t in new old; do
  src="$root"; [ $t = old ] && src="$old"
  ( cmake -S "$src" -B "$src/build-ab" -G Ninja -DCMAKE_BUILD_TYPE=Release -DQSDPA_CUDA=ON \
      -DCMAKE_CUDA_ARCHITECTURES=90a-real -DQSDPA_TEST_MLX=OFF -DQSDPA_PYTHON=OFF -DQSDPA_BUILD_TESTS=OFF \
      "${deps_flag[@]}" >/dev/null 2>&1 && cmake --build "$src/build-ab" -j"$jobs" --target qsdpa_cli >/dev/null 2>&1
    echo "$t build rc $?" >>"$out/ab.log" ) &
done
wait
for r in $(seq 1 "$rounds"); do
  for t in new old; do
    cli="$root/build-ab/tools/qsdpa"; [ $t = old ] && cli="$old/build-ab/tools/qsdpa"
    for fl in "$@"; do
      # shellcheck disable=SC2086
      "$cli" bench --backend cuda --no-torch --jsonl $fl 2>>"$out/ab.log" |
        python3 -c 'import json,sys
for l in sys.stdin:
    l=l.strip()
    if l.startswith("{"): r=json.loads(l); r["ab"]=sys.argv[1]; r["round"]=int(sys.argv[2]); print(json.dumps(r))' "$t" "$r" >>"$out/ab.jsonl"
    done
  done
done
python3 - "$out/ab.jsonl" <<'PY' | tee -a "$out/ab.log"
import json, sys, statistics, collections
t = collections.defaultdict(list)
for line in open(sys.argv[1]):
    r = json.loads(line)
    t[((r["B"], r["Lq"], r["N"], r["D"], r["bits"]), r["ab"])].append(r["time_us"])
for key in sorted({k for k, _ in t}):
    print("B Lq N D bits", key, " | ".join("%s %.1f" % (v, statistics.median(t[(key, v)])) for v in ("new", "old") if (key, v) in t))
PY
