#!/usr/bin/env bash
# Tuning run on a GPU machine: builds the `qsdpa` program once per variant of the CUDA build-time
# knobs, then times `qsdpa bench --backend cuda` (the default sweep, or the shapes given) for every
# variant in interleaved rounds, so that drift of the machine hits all variants alike (each round
# starts one variant further along, so that no variant always runs first or last). Usage:
#
#   scripts/gpu_tune.sh build OUTDIR 'name=-DKNOB=1 -DOTHER=2' ...
#   scripts/gpu_tune.sh bench OUTDIR ROUNDS 'name=...' ... [-- bench flags]
#
# `build` builds the variants in parallel, in build-tune-NAME (the variant named base is the main
# build, QSDPA_GPU_BUILD, default build-gpu; a variant 'name=:FLAGS' is the main build's program
# run with the bench flags FLAGS, e.g. 'nopdl=:--no-pdl'; a variant 'name=@VAR=VALUE ...' is the main
# build's program run with those environment variables, e.g. 'nopool=@QSDPA_BLOCK_POOL=0');
# `bench` writes OUTDIR/tune.jsonl
# (one bench record per shape, variant and round, with keys "variant" and "round" added) and
# appends to OUTDIR/tune.log, ending with the median time of each shape and variant.
# QSDPA_GPU_TUNE_EXTRA='flags;flags' adds custom shapes (e.g. '--B 8 --N 32768 --paged 64').
set -uo pipefail
mode="${1:?usage: scripts/gpu_tune.sh build|bench OUTDIR [ROUNDS] VARIANT... [-- bench flags]}"
out="${2:?OUTDIR}"
shift 2
rounds=1
if [ "$mode" = bench ]; then rounds="${1:?rounds}"; shift; fi
mkdir -p "$out"
out="$(cd "$out" && pwd)"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
variants=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do variants+=("$1"); shift; done
[ "${1:-}" = "--" ] && shift
bench_flags=("$@")
log="$out/tune.log"
deps_flag=()
[ -d "$root/.deps" ] && deps_flag=(-DQSDPA_DEPS_DIR="$root/.deps")
jobs=$(nproc)
if [ "$mode" = build ]; then
pids=()
for v in "${variants[@]}"; do
  name="${v%%=*}" flags="${v#*=}"
  [ "$name" = base ] && continue  # the main build (QSDPA_GPU_BUILD, default build-gpu)
  [ "${flags:0:1}" = : ] && continue  # the main build with other bench flags
  [ "${flags:0:1}" = @ ] && continue  # the main build with environment variables
  (
    cmake -S . -B "build-tune-$name" -G Ninja -DCMAKE_BUILD_TYPE=Release -DQSDPA_CUDA=ON \
      -DCMAKE_CUDA_ARCHITECTURES=90a-real -DQSDPA_TEST_MLX=OFF -DQSDPA_PYTHON=OFF -DQSDPA_BUILD_TESTS=OFF \
      "${deps_flag[@]}" "-DCMAKE_CUDA_FLAGS=$flags" >"build-tune-$name.cfg.log" 2>&1 &&
      cmake --build "build-tune-$name" -j"$jobs" --target qsdpa_cli >"build-tune-$name.log" 2>&1
    echo "variant $name ($flags): build rc $?" >>"$log"
  ) &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p"; done
exit 0
fi
# JSON lines on stdin, with the keys "variant" ($1) and "round" ($2) added
tag() {
  python3 -c 'import json,sys
for line in sys.stdin:
    line=line.strip()
    if not line: continue
    r=json.loads(line); r["variant"]=sys.argv[1]; r["round"]=int(sys.argv[2]); print(json.dumps(r))' "$1" "$2"
}
nv=${#variants[@]}
for r in $(seq 1 "$rounds"); do
  # Round r starts at variant (r - 1) mod n: over n rounds (or a multiple) each variant runs once in
  # each place of the round (each still after the same neighbour). (Until 2026-12-07 every round
  # ran them in the given order; in runs 104-105 the variant that ran last was 1.5-4 us faster on
  # shapes whose code it shared with the others: its place or its build, not told apart.)
  for ((j = 0; j < nv; ++j)); do
    v="${variants[$(((j + r - 1) % nv))]}"
    name="${v%%=*}" flags="${v#*=}" vflags=() venv=()
    cli="build-tune-$name/tools/qsdpa"
    [ "$name" = base ] && cli="${QSDPA_GPU_BUILD:-build-gpu}/tools/qsdpa"
    if [ "${flags:0:1}" = : ]; then
      cli="${QSDPA_GPU_BUILD:-build-gpu}/tools/qsdpa"
      read -r -a vflags <<<"${flags:1}"
    elif [ "${flags:0:1}" = @ ]; then
      cli="${QSDPA_GPU_BUILD:-build-gpu}/tools/qsdpa"
      read -r -a venv <<<"${flags:1}"
    fi
    [ -x "$cli" ] || continue
    env "${venv[@]}" "$cli" bench --backend cuda --no-torch --jsonl "${vflags[@]}" "${bench_flags[@]}" 2>>"$log" | tag "$name" "$r" >>"$out/tune.jsonl"
    # further shapes (QSDPA_GPU_TUNE_EXTRA: bench flag sets separated by ';'), once per round
    IFS=';' read -r -a extra <<<"${QSDPA_GPU_TUNE_EXTRA:-}"
    for fl in "${extra[@]}"; do
      [ -n "${fl// /}" ] || continue
      # shellcheck disable=SC2086
      env "${venv[@]}" "$cli" bench --backend cuda --no-torch --jsonl "${vflags[@]}" $fl 2>>"$log" | tag "$name" "$r" >>"$out/tune.jsonl"
    done
    echo "round $r variant $name: done" >>"$log"
  done
done
# one line per shape: the median over rounds of each variant's time
python3 - "$out/tune.jsonl" <<'EOF' | tee -a "$log"
import json, sys, statistics, collections
t = collections.defaultdict(list)
order = []
for line in open(sys.argv[1]):
    r = json.loads(line)
    key = (r["B"], r["Hq"], r["Hkv"], r["Lq"], r["N"], r["D"], r.get("k_bits"), r.get("v_bits"), r.get("paged", 0))
    for what in ("time_us", "graph_time_us", "graph_chain_time_us"):  # (graphs: rows of their own)
        if what not in r: continue
        k = key + ({"time_us": (), "graph_time_us": ("graph",), "graph_chain_time_us": ("graph10",)}[what])
        if k not in order: order.append(k)
        t[(k, r["variant"])].append(r[what])
variants = sorted({v for (_, v) in t}, key=lambda v: v)
print("shape (B Hq Hkv Lq N D kbits vbits paged) | " + " | ".join(variants))
for key in order:
    print(" ".join(map(str, key)) + " | " + " | ".join(
        "%.1f" % statistics.median(t[(key, v)]) if (key, v) in t else "-" for v in variants))
EOF
