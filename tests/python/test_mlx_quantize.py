#!/usr/bin/env python3
"""qsdpa's quantizer must be bit-identical to MLX's CPU mx.quantize (SPEC section 2).

For bits 2, 4, 8, group sizes 32, 64, 128 and element types f32, f16, bf16, random matrices whose
groups are drawn from many kinds (Gaussian at magnitudes from 1e-8 to 1e20, constant groups, zero
groups, a single outlier, negative-only and positive-only groups, integer grids that put (w - z) / s
exactly on .5 ties, two-valued and symmetric groups, tiny groups where the 1e-7 scale floor acts,
constants so large that q0 overflows, ranges so wide that the scale is infinite) are
quantized by MLX and by qsdpa (through the helper executable tests/tools/quantize_file, which runs
the reference and the cpu backend and fails if they differ). Packed words, scales and biases must
agree in every bit.

    python3 tests/python/test_mlx_quantize.py --exe build/tests/quantize_file

Plain Python, no pytest needed. The test fails (it never skips) when MLX cannot be imported: it
then tries `python3 -m pip install mlx mlx-cpu numpy` once, and fails if that does not help.
"""
import argparse
import importlib
import os
import subprocess
import sys
import tempfile


def import_mlx():
    """Returns (mx, np), installing mlx / mlx-cpu / numpy with pip when they are missing."""
    try:
        import mlx.core as mx
        import numpy as np
        return mx, np
    except ImportError as e:
        print(f"mlx or numpy not importable ({e}); installing with pip", flush=True)
    r = subprocess.run([sys.executable, "-m", "pip", "install", "mlx", "mlx-cpu", "numpy"])
    if r.returncode != 0:
        sys.exit(f"FAIL: could not install mlx / mlx-cpu / numpy with pip into {sys.executable}; "
                 "the MLX bit-exactness test needs them (point CMake at an interpreter that has "
                 "them with -DPython3_EXECUTABLE=...)")
    importlib.invalidate_caches()
    try:
        import mlx.core as mx
        import numpy as np
        return mx, np
    except ImportError as e:
        sys.exit(f"FAIL: mlx still not importable after pip install: {e}")


mx, np = import_mlx()

DTYPES = {
    # name: (mlx dtype, numpy view type used for the raw bits, numpy bit-pattern type)
    "f32": (mx.float32, mx.float32, np.uint32),
    "f16": (mx.float16, mx.uint16, np.uint16),
    "bf16": (mx.bfloat16, mx.uint16, np.uint16),
}
BITS = (2, 4, 8)
GROUPS = (32, 64, 128)
KIND_NAMES = ("gauss", "const", "zero", "outlier", "neg-only", "pos-only", "grid", "two-value",
              "symmetric", "tiny", "one-nonzero", "huge", "huge-const", "full-range")


def max_magnitude(dtype):
    # Keep groups finite after the conversion to T (f16 ends at 65504) and (hi - lo) finite in f32.
    return {"f32": 1e20, "f16": 2e4, "bf16": 1e20}[dtype]


def make_group(rng, kind, G, dtype):
    """One group of G float64 values of the given kind (later rounded to T by MLX's cast)."""
    top = np.log10(max_magnitude(dtype))
    mag = 10.0 ** rng.uniform(-3.0, min(3.0, top))
    if kind == "gauss":
        mag = 10.0 ** rng.uniform(-8.0, top - 1.0)
        return rng.standard_normal(G) * mag + mag * rng.uniform(-2.0, 2.0)
    if kind == "const":
        return np.full(G, rng.choice([-1.0, 1.0]) * mag * rng.uniform(0.5, 2.0))
    if kind == "zero":
        return np.zeros(G)
    if kind == "outlier":
        g = rng.standard_normal(G) * mag
        big = min(mag * rng.uniform(20.0, 1000.0), max_magnitude(dtype))
        g[rng.integers(G)] = rng.choice([-1.0, 1.0]) * big
        return g
    if kind == "neg-only":
        return -np.abs(rng.standard_normal(G)) * mag - mag * rng.uniform(0.0, 3.0)
    if kind == "pos-only":
        return np.abs(rng.standard_normal(G)) * mag + mag * rng.uniform(0.0, 3.0)
    if kind == "grid":
        # Integers 0..2n (n = 2^bits - 1 for one of the bit widths) with both ends present: the
        # scale is a power-of-two multiple and the odd values fall exactly on rounding ties.
        n = int(rng.choice([3, 15, 255]))
        step = 2.0 ** int(rng.integers(-6, 4))
        g = rng.integers(0, 2 * n + 1, G).astype(np.float64)
        g[rng.integers(G)] = 0.0
        g[rng.integers(G)] = 2.0 * n
        shift = float(rng.choice([0.0, -n, -2.0 * n, float(rng.integers(-3 * n, 3 * n))]))
        return (g + shift) * step
    if kind == "two-value":
        a, b = rng.standard_normal(2) * mag
        return np.where(rng.random(G) < 0.5, a, b)
    if kind == "symmetric":
        g = rng.uniform(-mag, mag, G)
        g[rng.integers(G)] = -mag
        g[rng.integers(G)] = mag
        return g
    if kind == "tiny":
        # Ranges below n * 1e-7: the scale floor of 1e-7 applies and q0 may round to 0.
        return rng.standard_normal(G) * 10.0 ** rng.uniform(-10.0, -6.0)
    if kind == "one-nonzero":
        g = np.zeros(G)
        g[rng.integers(G)] = rng.choice([-1.0, 1.0]) * mag
        return g
    if kind == "huge":
        m = max_magnitude(dtype) * rng.uniform(0.1, 1.0)
        return rng.uniform(-m, m, G) * rng.choice([1.0, 0.0, 0.5], p=[0.5, 0.25, 0.25]) + \
            rng.choice([0.0, m / 4])
    if kind == "huge-const":
        # f32 / bf16: a constant beyond 3.4e31 makes edge / 1e-7 overflow, so q0 is infinite, the
        # scale is -0 and (w - z) / s is NaN, which both quantizers must clamp to code 0.
        m = {"f32": 3.4e38, "f16": 65504.0, "bf16": 3.38e38}[dtype]
        return np.full(G, rng.choice([-1.0, 1.0]) * m * 10.0 ** rng.uniform(-7.0, 0.0))
    if kind == "full-range":
        # f32 / bf16: hi - lo overflows to inf, so the scale is infinite.
        m = {"f32": 3.4e38, "f16": 65504.0, "bf16": 3.38e38}[dtype]
        g = rng.uniform(-m, m, G)
        g[rng.integers(G)] = -m * rng.uniform(0.9, 1.0)
        g[rng.integers(G)] = m * rng.uniform(0.9, 1.0)
        return g
    raise ValueError(kind)


def make_matrix(rng, rows, dim, G, dtype):
    """float32 matrix [rows, dim], each group of G values drawn from a kind (every kind appears)."""
    ngroups = rows * (dim // G)
    kinds = [KIND_NAMES[i % len(KIND_NAMES)] for i in range(ngroups)]
    rng.shuffle(kinds)
    w = np.concatenate([make_group(rng, k, G, dtype) for k in kinds]).reshape(rows, dim)
    return w.astype(np.float32), np.array(kinds).reshape(rows, dim // G)


def raw_bits(a, dtype):
    """The exact bits of an mlx array of type T as a numpy unsigned array."""
    _, view, bits_type = DTYPES[dtype]
    return np.array(a.view(view) if view != mx.float32 else a).view(bits_type)


def check(exe, tmp, dtype, bits, G, w_f32, kinds):
    """Quantizes with MLX and with qsdpa; returns a list of mismatch descriptions."""
    rows, dim = w_f32.shape
    wt = mx.array(w_f32).astype(DTYPES[dtype][0])  # rounded to T once, used by both quantizers
    wq, scales, biases = mx.quantize(wt, group_size=G, bits=bits, stream=mx.cpu)
    mx.eval(wq, scales, biases)
    if scales.dtype != wt.dtype or biases.dtype != wt.dtype:
        return [f"MLX returned scales of type {scales.dtype}, biases {biases.dtype}, not {wt.dtype}"]
    # Finite inputs only: a group holding inf gives NaN scales, and MLX writes its own NaN
    # pattern (0x7d00 in f16, 0x7fc0 in bf16) where qsdpa keeps the payload; the SPEC does not
    # define quantization of non-finite values.
    if not bool(mx.all(mx.isfinite(wt)).item()):
        return ["test data not finite in T (a bug in this script)"]
    w_bits = raw_bits(wt, dtype)
    m_packed = np.array(wq).astype(np.uint32)
    m_scales, m_biases = raw_bits(scales, dtype), raw_bits(biases, dtype)

    stem = os.path.join(tmp, f"{dtype}_b{bits}_g{G}")
    w_bits.tofile(stem + ".in")
    cmd = [exe, stem + ".in", str(rows), str(dim), str(bits), str(G), dtype, stem]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        return [f"quantize_file failed ({r.returncode}): {r.stderr.strip()}"]
    q_packed = np.fromfile(stem + ".packed", dtype=np.uint32)
    bt = DTYPES[dtype][2]
    q_scales = np.fromfile(stem + ".scales", dtype=bt)
    q_biases = np.fromfile(stem + ".biases", dtype=bt)

    errors = []
    per = 32 // bits
    for name, ours, theirs, unit in (("packed", q_packed, m_packed.reshape(-1), G // per),
                                     ("scales", q_scales, m_scales.reshape(-1), 1),
                                     ("biases", q_biases, m_biases.reshape(-1), 1)):
        if ours.shape != theirs.shape:
            errors.append(f"{name}: {ours.size} elements, MLX has {theirs.size}")
            continue
        bad = np.nonzero(ours != theirs)[0]
        if bad.size:
            i = int(bad[0])
            grp = i // unit  # flat group index
            r_, g_ = divmod(grp, dim // G)
            vals = w_bits.reshape(rows, dim)[r_, g_ * G:(g_ + 1) * G]
            errors.append(
                f"{name}: {bad.size} of {ours.size} differ; first at {i} (row {r_}, group {g_}, "
                f"kind {kinds[r_, g_]}): ours 0x{int(ours[i]):x}, MLX 0x{int(theirs[i]):x}; "
                f"group bits {[hex(int(v)) for v in vals[:8]]}...")
    return errors


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--exe", required=True, help="path of the quantize_file helper executable")
    ap.add_argument("--rows", type=int, default=384)
    ap.add_argument("--dim", type=int, default=512)
    ap.add_argument("--seed", type=int, default=20240611)
    args = ap.parse_args()
    if not os.path.isfile(args.exe):
        sys.exit(f"FAIL: helper executable {args.exe} not found")
    print(f"mlx {mx.__version__}, numpy {np.__version__}, helper {args.exe}", flush=True)

    failures = 0
    cases = 0
    with tempfile.TemporaryDirectory(prefix="qsdpa_mlx_") as tmp:
        for di, dtype in enumerate(DTYPES):
            for gi, G in enumerate(GROUPS):
                rng = np.random.default_rng([args.seed, di, gi])
                w, kinds = make_matrix(rng, args.rows, args.dim, G, dtype)
                for bits in BITS:
                    cases += 1
                    errs = check(args.exe, tmp, dtype, bits, G, w, kinds)
                    status = "ok" if not errs else "FAIL"
                    print(f"{status:4} dtype={dtype:4} bits={bits} group={G:3} "
                          f"({args.rows}x{args.dim})", flush=True)
                    for e in errs:
                        print(f"     {e}", flush=True)
                    failures += bool(errs)
    if failures:
        print(f"FAIL: {failures} of {cases} cases differ from mx.quantize (mlx {mx.__version__})")
        return 1
    print(f"PASS: {cases} cases bit-identical to mx.quantize (mlx {mx.__version__})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
