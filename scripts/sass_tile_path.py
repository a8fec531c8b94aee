#!/usr/bin/env python3
"""Instructions a full tile issues in the attention kernels' token loop, read off their SASS.

    cuobjdump -sass OBJ.o > K.sass
    scripts/sass_tile_path.py K.sass [--kernel SUBSTRING] [--list]
    scripts/sass_tile_path.py --self-test

For each kernel (a `Function :` section; --kernel keeps those whose mangled name contains
SUBSTRING) the token loop is taken to be the predicated backward branch whose span holds the most
HMMA (ties: the shortest span). Two paths from the loop's head to that back edge are counted, each
the shortest one over the branches (a breadth-first search, every instruction one step), so that
optional code (masks, a new maximum, an exponent move, warp-divergence fallbacks) is left out:

  bare       the shortest path at all (it skips the tile's copies, which sit behind a branch);
  full tile  the shortest path through at least one unpredicated LDGSTS (a full tile's cp.async
             copies; the partial tile's are predicated), i.e. what a tile in the middle of a split
             issues.

Static counts, not a profile: where the common path is not the shortest (a branch the hot path
takes that skips less code than its alternative), the count is off by that difference. Compare two
builds of the same kernel with it (docs/PERF.md, 2026-12-07: kVPack), not kernels of different
shapes. --list prints the full-tile path.
"""
import argparse
import collections
import re
import sys
from collections import deque

_FUNC = re.compile(r"\s*Function : (\S+)")
_INS = re.compile(r"\s*/\*([0-9a-f]{4,})\*/\s+(@(!?U?P\w+)\s+)?([A-Z][A-Z0-9_.]*)(.*)")
_TARGET = re.compile(r"0x([0-9a-f]+)")


def parse(text):
    """{kernel: [(address, predicate or None, opcode, operands)]} in address order."""
    funcs, cur = {}, None
    for line in text.splitlines():
        m = _FUNC.match(line)
        if m:
            cur = m.group(1)
            funcs[cur] = []
            continue
        m = _INS.match(line)
        if m and cur is not None:
            funcs[cur].append((int(m.group(1), 16), m.group(3), m.group(4), m.group(5)))
    return funcs


def _target(operands):
    m = _TARGET.search(operands)
    return int(m.group(1), 16) if m else None


def find_loop(ins):
    """(head address, back-edge address) of the token loop, or None."""
    best = None
    for addr, pred, op, rest in ins:
        if not op.startswith("BRA") or pred is None:
            continue
        t = _target(rest)
        if t is None or t >= addr:
            continue
        n = sum(1 for a, _, o, _ in ins if t <= a <= addr and o.startswith("HMMA"))
        if n and (best is None or n > best[2] or (n == best[2] and addr - t < best[1] - best[0])):
            best = (t, addr, n)
    return None if best is None else best[:2]


def _successors(ins):
    index = {a: i for i, (a, _, _, _) in enumerate(ins)}

    def succ(i):
        _, pred, op, rest = ins[i]
        if op.startswith("BRA"):
            t = _target(rest)
            out = [index[t]] if t in index else []
            # conditional: a predicate on the branch, a predicate operand (BRA P1, target), or DIV
            if pred or "DIV" in op or re.search(r"\bP\d", rest.split("0x")[0]):
                out.append(i + 1)
            return out
        if op.startswith("EXIT") or op.startswith("RET"):
            return [i + 1] if pred else []
        return [i + 1] if i + 1 < len(ins) else []

    return index, succ


def _bfs(succ, s, t):
    prev, dq = {s: None}, deque([s])
    while dq:
        i = dq.popleft()
        if i == t:
            break
        for j in succ(i):
            if j not in prev:
                prev[j] = i
                dq.append(j)
    if t not in prev:
        return []
    path, i = [], t
    while i is not None:
        path.append(i)
        i = prev[i]
    return path[::-1]


def tile_paths(ins):
    """(bare path, full-tile path) as lists of instruction indices; [] where none exists."""
    loop = find_loop(ins)
    if loop is None:
        return [], []
    index, succ = _successors(ins)
    s, t = index[loop[0]], index[loop[1]]
    bare = _bfs(succ, s, t)
    full = []
    for x in range(s, t):
        _, pred, op, rest = ins[x]
        if not op.startswith("LDGSTS") or pred is not None or re.search(r"\bP\d\s*;", rest):
            continue
        p1, p2 = _bfs(succ, s, x), _bfs(succ, x, t)
        if p1 and p2 and (not full or len(p1) + len(p2) - 1 < len(full)):
            full = p1 + p2[1:]
    return bare, full


def histogram(ins, path):
    return collections.Counter(ins[i][2].split(".")[0] for i in path)


def report(text, kernel="", listing=False, out=sys.stdout):
    for name, ins in parse(text).items():
        if kernel not in name:
            continue
        bare, full = tile_paths(ins)
        if not bare:
            print(f"{name}: no token loop found", file=out)
            continue
        h = histogram(ins, full or bare)
        print(f"{name}\n  bare {len(bare)}, full tile {len(full) if full else '-'}: "
              + " ".join(f"{k}:{v}" for k, v in h.most_common(24)), file=out)
        if listing:
            for i in full or bare:
                a, p, op, rest = ins[i]
                print(f"    {a:#07x} {'@' + p + ' ' if p else ''}{op}{rest.split(';')[0]}", file=out)


_SAMPLE = """
        Function : kernel_a
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   IMAD R2, R1, 0x2, RZ ;
        /*0020*/              @P4 BRA 0x90 ;
        /*0030*/              @P0 BRA 0x60 ;
        /*0040*/                   LDGSTS.E.BYPASS.LTC128B.128 [R3], desc[UR4][R4.64], P1 ;
        /*0050*/                   BRA 0x90 ;
        /*0060*/                   LDGSTS.E.BYPASS.LTC128B.128 [R3], desc[UR4][R4.64] ;
        /*0070*/                   LDGSTS.E.BYPASS.LTC128B.128 [R3+0x10], desc[UR4][R6.64] ;
        /*0080*/                   LDGSTS.E.BYPASS.LTC128B.128 [R3+0x20], desc[UR4][R8.64] ;
        /*0090*/                   HMMA.16816.F32 R8, R12, R16, R8 ;
        /*00a0*/              @P2 BRA 0xd0 ;
        /*00b0*/                   FMUL R9, R9, R10 ;
        /*00c0*/                   FMUL R10, R10, R10 ;
        /*00d0*/                   HMMA.16816.F32 R8, R12, R18, R8 ;
        /*00e0*/              @P3 BRA 0x10 ;
        /*00f0*/                   EXIT ;
        /*0100*/                   BRA.DIV UR4, 0x20 ;
"""


def self_test():
    ins = parse(_SAMPLE)["kernel_a"]
    assert find_loop(ins) == (0x10, 0xE0), find_loop(ins)
    bare, full = tile_paths(ins)
    addrs = lambda path: [ins[i][0] for i in path]
    # bare: the copies skipped (0x20), the FMULs skipped (0xa0)
    assert addrs(bare) == [0x10, 0x20, 0x90, 0xA0, 0xD0, 0xE0], addrs(bare)
    # full tile: through the unpredicated copies, not the partial tile's shorter predicated one
    assert addrs(full) == [0x10, 0x20, 0x30, 0x60, 0x70, 0x80, 0x90, 0xA0, 0xD0, 0xE0], addrs(full)
    h = histogram(ins, full)
    assert h["LDGSTS"] == 3 and h["HMMA"] == 2 and h["FMUL"] == 0, h
    print("sass_tile_path self-test: ok")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("sass", nargs="?", help="cuobjdump -sass output")
    ap.add_argument("--kernel", default="", help="only kernels whose mangled name contains this")
    ap.add_argument("--list", action="store_true", help="print the full-tile path")
    ap.add_argument("--self-test", action="store_true")
    args = ap.parse_args()
    if args.self_test:
        self_test()
        return
    if not args.sass:
        ap.error("a SASS listing is needed (or --self-test)")
    with open(args.sass) as f:
        report(f.read(), args.kernel, args.list)


if __name__ == "__main__":
    main()
