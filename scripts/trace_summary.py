#!/usr/bin/env python3
"""Summarize the block traces of a trace build (-DQSDPA_MMA_TRACE=1, QSDPA_TRACE_FILE; see
src/cuda/backend.cu): per traced call, when the tensor-core kernel's blocks started, ended their
token loop and ended, in microseconds from the earliest start, and how busy the slots were.

    scripts/trace_summary.py TRACE.jsonl [LABEL]
"""
import json
import sys


def pct(v, q):
    v = sorted(v)
    if not v:
        return float("nan")
    k = min(len(v) - 1, max(0, int(round(q / 100.0 * (len(v) - 1)))))
    return v[k]


def five(v):
    return "/".join(f"{pct(v, q) / 1000:.1f}" for q in (0, 10, 50, 90, 100))


def main():
    path = sys.argv[1]
    label = sys.argv[2] if len(sys.argv) > 2 else path
    print(f"== {label}: times in us from the earliest block start; min/p10/p50/p90/max")
    for line in open(path):
        line = line.strip()
        if not line:
            continue
        r = json.loads(line)
        bl = r["blocks"]
        if not bl:
            continue
        start = [b[4] for b in bl]
        loop = [b[5] - b[4] for b in bl]
        epi = [b[6] - b[5] for b in bl if not b[3]]
        epim = [b[6] - b[5] for b in bl if b[3]]
        end = [b[6] for b in bl]
        # (records with the warps' loop ends) the spread of the warps' loop ends within each block
        wsp = [max(b[7:11]) - min(b[7:11]) for b in bl if len(b) > 10 and min(b[7:11]) > 0]
        # (and thread 0's epilogue: loop end -> stores issued -> arrival's atomic returned)
        sto = [b[11] - b[5] for b in bl if len(b) > 11 and b[11] > 0]
        arr = [b[12] - b[11] for b in bl if len(b) > 12 and b[12] > 0 and b[11] > 0]
        # (records with thread 0's steps, mma_kernel.cuh kTraceProlog..kTraceMerge2) the phases
        def ph(i, j, merged=None):
            return [b[j] - b[i] for b in bl if len(b) > max(i, j) and (b[i] > 0 or i == 4) and b[j] > 0
                    and (merged is None or bool(b[3]) == merged)]
        steps = []
        if len(bl[0]) > 18:
            steps = [("start -> query rows ready", ph(4, 13)), ("start -> first tile in", ph(4, 14))]
            if len(bl[0]) > 20:  # (the prologue's steps, mma_kernel.cuh kTraceQIn, kTraceBOps)
                steps += [("start -> query rows in shared memory", ph(4, 19)),
                          ("rows in shared memory -> reduced (rows ready)", ph(19, 13)),
                          ("rows ready -> B operands in registers", ph(13, 20))]
            steps += [("loop end -> o stored", ph(5, 15)), ("o stored -> per-row step", ph(15, 16)),
                      ("per-row step -> stores issued", ph(16, 11)),
                      ("stores -> merge step 1 (cluster barrier / m, l loaded)", ph(11, 17)),
                      ("merge step 1 -> step 2 (weights)", ph(17, 18)), ("merge step 2 -> end", ph(18, 6)),
                      ("arrival -> m, l loaded (merging blocks)", ph(12, 17, True))]
        span = max(end)
        sms = {}
        for b in bl:
            sms.setdefault(b[2], []).append(b)
        per_sm = {}
        for s, v in sms.items():
            per_sm.setdefault(len(v), 0)
            per_sm[len(v)] += 1
        # slot occupancy over time: blocks running in each tenth of the span
        bins = 10
        act = []
        for i in range(bins):
            t = span * (i + 0.5) / bins
            act.append(sum(1 for b in bl if b[4] <= t < b[6]))
        busy = sum(b[6] - b[4] for b in bl) / (span * max(act + [1]))
        sm_last = sorted(max(b[6] for b in v) for v in sms.values())
        print(f"call {r['call']}: grid {r['gx']}x{r['gy']}, {len(bl)} blocks on {len(sms)} SMs "
              f"(blocks per SM: {dict(sorted(per_sm.items()))}); span {span / 1000:.1f}")
        print(f"  start {five(start)} | loop {five(loop)} | end {five(end)}")
        print(f"  after the loop: {five(epi)} (no merge), {five(epim)} ({len(epim)} merging blocks)")
        if wsp:
            print(f"  warps' loop ends within a block, last - first: {five(wsp)}")
        if sto:
            print(f"  loop end -> partial stores issued: {five(sto)}; -> arrival's atomic back: {five(arr)}")
        for name, v in steps:
            if v:
                print(f"  {name}: {five(v)}")
        print(f"  SMs' last block end {five(sm_last)}; running blocks per tenth: {act}; "
              f"slot-time used {busy * 100:.0f} %")
        # the splits of each row tile (a cluster when they merge in clusters): how far apart they
        # end, on how many SMs they ran, and when the row tiles end
        tiles = {}
        for b in bl:
            tiles.setdefault(b[0], []).append(b)
        if r["gy"] > 1:
            tsp = [max(b[6] for b in v) - min(b[6] for b in v) for v in tiles.values()]
            tsm = [len({b[2] for b in v}) for v in tiles.values()]
            tend = [max(b[6] for b in v) for v in tiles.values()]
            nsm = "/".join(str(pct(tsm, q)) for q in (0, 10, 50, 90, 100))
            print(f"  row tiles' splits: end spread {five(tsp)}; SMs per row tile {nsm}; row tiles' end {five(tend)}")
        # the combine kernel's blocks ([start, wait ended, end, sm] and, from 2026-12-06 on, (m, l)
        # reduced and summed; from the same origin; start: when the block was placed, before its
        # wait, in traces from 2026-12-06 on, after it before): when they were placed, when their
        # wait ended, and how long after the attention grid's last block the last of them ended
        cb = r.get("combine", [])
        if cb:
            cs = [c[0] for c in cb]
            cw = [c[1] for c in cb if c[1] > 0]
            ce = [c[2] for c in cb]
            print(f"  combine: {len(cb)} blocks; start {five(cs)} | wait ended {five(cw)} | end {five(ce)}; "
                  f"last end - attention's last end {(max(ce) - span) / 1000:.1f}")
            steps = [c for c in cb if len(c) >= 6 and c[1] > 0 and c[4] >= c[1] and c[5] >= c[4]]
            if steps:
                per_sm = {}
                for c in cb:
                    per_sm[c[3]] = per_sm.get(c[3], 0) + 1
                print(f"    wait ended -> (m, l) in and reduced {five([c[4] - c[1] for c in steps])}; "
                      f"-> row summed {five([c[5] - c[4] for c in steps])}; -> end {five([c[2] - c[5] for c in steps])}")
                for k in sorted(set(per_sm.values())):
                    d = [c[2] - c[1] for c in steps if per_sm[c[3]] == k]
                    if d:
                        print(f"    {k} combine block(s) on the SM ({len(d)} blocks): wait ended -> end {five(d)}")


if __name__ == "__main__":
    main()
