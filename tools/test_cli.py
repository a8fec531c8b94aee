#!/usr/bin/env python3
"""Smoke test of the qsdpa program (no GPU, no third-party modules): `qsdpa info` runs; a small
`qsdpa run` on the reference backend prints JSON that parses, with the expected fields and a small
error; `qsdpa bench --cold-l2` on the CPU says what it read before each call; a bad flag fails with
one line naming it; a library error is one `qsdpa: error:` line."""
import json
import subprocess
import sys


def run(exe, *args):
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=240)


def fail(msg, proc=None):
    print("FAIL:", msg)
    if proc is not None:
        print("exit status:", proc.returncode)
        print("stdout:", proc.stdout)
        print("stderr:", proc.stderr)
    sys.exit(1)


def main():
    exe = sys.argv[1]

    p = run(exe, "info")
    if p.returncode != 0 or "qsdpa" not in p.stdout or "cpu" not in p.stdout:
        fail("qsdpa info", p)

    p = run(exe, "run", "--backend", "reference", "--N", "256", "--Hq", "8", "--Hkv", "2", "--json")
    if p.returncode != 0:
        fail("qsdpa run --json exited non-zero", p)
    try:
        r = json.loads(p.stdout)
    except ValueError as e:
        fail(f"qsdpa run --json printed no JSON ({e})", p)
    for key in ("backend", "B", "Hq", "Hkv", "Lq", "N", "D", "bits", "group", "dtype", "time_us",
                "gbps", "err_vs_reference", "quant_err", "cache_bytes", "fp16_cache_bytes"):
        if key not in r:
            fail(f"key {key} missing from the JSON", p)
    if r["backend"] != "reference" or r["N"] != 256 or r["Hq"] != 8 or r["Hkv"] != 2:
        fail("the JSON does not describe the problem asked for", p)
    if not (0 <= r["err_vs_reference"] < 1e-3):
        fail(f"err_vs_reference {r['err_vs_reference']} is not small", p)
    # The 4-bit cache costs about 0.3 in relative L2 on this data (its keys have outlier channels);
    # a number far off means a broken check.
    if not (1e-4 < r["quant_err"] < 1.0):
        fail(f"quant_err {r['quant_err']} is implausible for a 4-bit cache", p)
    if not (r["time_us"] > 0 and r["cache_bytes"] > 0 and r["fp16_cache_bytes"] > r["cache_bytes"]):
        fail("time or memory fields are wrong", p)

    # The serving layouts through the program: a paged cache with per-sequence lengths and
    # different K and V formats, on the CPU backend, checked against the reference.
    p = run(exe, "run", "--backend", "cpu", "--paged", "32", "--kv-lens", "1,17,300", "--k-bits", "8",
            "--v-bits", "4", "--Hq", "8", "--Hkv", "2", "--json")
    if p.returncode != 0:
        fail("qsdpa run --paged --kv-lens exited non-zero", p)
    r = json.loads(p.stdout)
    if r["B"] != 3 or r["N"] != 300 or r.get("paged") != 32 or r.get("kv_lens") != [1, 17, 300]:
        fail("the JSON does not describe the paged problem asked for", p)
    if r["k_bits"] != 8 or r["v_bits"] != 4 or not (0 <= r["err_vs_reference"] < 1e-3):
        fail(f"paged run: formats or error wrong (err {r['err_vs_reference']})", p)

    # `qsdpa bench --cold-l2` on the CPU backend: each call preceded by a read of twice the L3,
    # said in the record (and absent without the flag).
    for cold in (True, False):
        args = ["bench", "--backend", "cpu", "--B", "1", "--Hq", "8", "--Hkv", "2", "--N", "256",
                "--iters", "3", "--jsonl"] + (["--cold-l2"] if cold else [])
        p = run(exe, *args)
        if p.returncode != 0:
            fail("qsdpa bench " + " ".join(args[1:]) + " exited non-zero", p)
        r = json.loads(p.stdout.strip().splitlines()[-1])
        if not (r["time_us"] > 0 and r["iters"] == 3 and r["N"] == 256):
            fail("qsdpa bench: the record does not describe the shape and timing asked for", p)
        if cold and not (r.get("cold_l2_bytes", 0) >= 2 << 20 and r["cold_l2_bytes"] % 16 == 0):
            fail("qsdpa bench --cold-l2: cold_l2_bytes missing or not twice a last-level cache", p)
        if not cold and "cold_l2_bytes" in r:
            fail("qsdpa bench without --cold-l2 reports cold_l2_bytes", p)

    p = run(exe, "run", "--bits", "3")
    lines = [l for l in p.stderr.splitlines() if l.strip()]
    if p.returncode == 0 or len(lines) != 1 or "bits" not in lines[0]:
        fail("qsdpa run --bits 3 must fail with one line naming bits", p)

    p = run(exe, "run", "--backend", "reference", "--N", "64", "--Hq", "12", "--Hkv", "5")
    lines = [l for l in p.stderr.splitlines() if l.strip()]
    if p.returncode != 1 or len(lines) != 1 or not lines[0].startswith("qsdpa: error:") or "Hkv" not in lines[0]:
        fail("a library error must be one 'qsdpa: error:' line and exit 1", p)

    print("ok")


if __name__ == "__main__":
    main()
