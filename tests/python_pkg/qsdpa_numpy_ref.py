"""An independent float64 NumPy evaluation of qsdpa's contract (docs/SPEC.md sections 2-4), and
the helpers the Python tests share: random inputs, the per-row accuracy check, dtypes by name."""
from __future__ import annotations

import math
import os

import numpy as np

try:
    import ml_dtypes

    BF16 = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # bfloat16 tests on NumPy skip without ml_dtypes
    BF16 = None

# SPEC section 4: per-row relative tolerance by element type.
TOL = {"float32": 2e-5, "float16": 2e-3, "bfloat16": 1.6e-2}
# Mantissa bits (for "one unit in the last place" comparisons).
MANTISSA = {"float32": 23, "float16": 10, "bfloat16": 7}

# The backend the tests run on: cpu by default; QSDPA_TEST_BACKEND=reference switches them.
BACKEND = os.environ.get("QSDPA_TEST_BACKEND", "cpu")


def np_dtype(name: str) -> np.dtype:
    if name == "bfloat16":
        if BF16 is None:
            import pytest

            pytest.skip("bfloat16 on NumPy needs ml_dtypes (pip install ml_dtypes)")
        return BF16
    return np.dtype(name)


def f64(a) -> np.ndarray:
    return np.asarray(a).astype(np.float64)


# ---- section 2: the quantized layout ---------------------------------------------------------


def unpack(packed: np.ndarray, bits: int) -> np.ndarray:
    """[..., W] uint32 -> [..., W * 32 / bits] integer codes, low bits first."""
    per = 32 // bits
    words = np.asarray(packed).view(np.uint32).astype(np.uint64)
    shifts = np.arange(per, dtype=np.uint64) * np.uint64(bits)
    codes = (words[..., :, None] >> shifts) & np.uint64((1 << bits) - 1)
    return codes.reshape(*words.shape[:-1], words.shape[-1] * per)


def dequantize64(packed, scales, biases, bits: int, group: int) -> np.ndarray:
    """The exact value s * q + z of every element, in float64."""
    codes = unpack(packed, bits).astype(np.float64)
    s = np.repeat(f64(scales), group, axis=-1)
    z = np.repeat(f64(biases), group, axis=-1)
    return s * codes + z


# ---- section 3: attention ----------------------------------------------------------------------


def attention64(q, k, v, *, scale=None, sinks=None, bool_mask=None, float_mask=None, window=0):
    """Attention in float64 over dequantized keys and values.

    q [B, Hq, Lq, D]; k, v [B, Hkv, N, D] (float64 values); masks [B, Hq, Lq, N]; sinks [Hq].
    """
    q = f64(q)
    B, Hq, Lq, D = q.shape
    Hkv, N = k.shape[1], k.shape[2]
    rep = Hq // Hkv
    k = np.repeat(k, rep, axis=1)
    v = np.repeat(v, rep, axis=1)
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    x = scale * np.einsum("bhid,bhtd->bhit", q, k)
    pos = N - Lq + np.arange(Lq)
    t = np.arange(N)
    visible = t[None, :] <= pos[:, None]
    if window:
        visible &= t[None, :] > pos[:, None] - window
    visible = np.broadcast_to(visible, x.shape).copy()
    if bool_mask is not None:
        visible &= np.asarray(bool_mask) != 0
    if float_mask is not None:
        fm = f64(float_mask)
        visible &= fm != -np.inf
        x = x + np.where(visible, fm, 0.0)
    x = np.where(visible, x, -np.inf)
    if sinks is not None:
        sink = np.broadcast_to(f64(sinks)[None, :, None, None], (B, Hq, Lq, 1))
        x = np.concatenate([x, sink], axis=-1)
    m = np.max(x, axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.exp(x - m)
    w = e / np.sum(e, axis=-1, keepdims=True)
    out = np.einsum("bhit,bhtd->bhid", w[..., :N], v)
    # A row without any visible key is all zeros (with or without a sink).
    return np.where(visible.any(axis=-1, keepdims=True), out, 0.0)


def row_errors(out, ref, dtype_name: str):
    """Per output row: (||out - ref||, allowed) with the SPEC's bound tol * ||ref|| + 1e-6 sqrt(D)."""
    out = f64(out)
    D = out.shape[-1]
    err = np.linalg.norm(out - ref, axis=-1)
    allowed = TOL[dtype_name] * np.linalg.norm(ref, axis=-1) + 1e-6 * math.sqrt(D)
    return err, allowed


def assert_close_rows(out, ref, dtype_name: str, tol_factor: float = 1.0):
    err, allowed = row_errors(out, ref, dtype_name)
    assert np.all(np.isfinite(f64(out))), "output has NaN or inf"
    bad = err > tol_factor * allowed
    assert not bad.any(), (
        f"{int(bad.sum())} of {bad.size} rows beyond tolerance; worst ratio "
        f"{float(np.max(err / allowed)) / tol_factor:.3g}")


def ulp(x: np.ndarray, dtype_name: str) -> np.ndarray:
    """One unit in the last place of |x| in the named element type (normal numbers)."""
    _, e = np.frexp(np.abs(f64(x)))
    return np.ldexp(1.0, e - 1 - MANTISSA[dtype_name])


# ---- random inputs -----------------------------------------------------------------------------


def random_cache(rng, B, Hkv, N, D, dtype, bits, group, qsdpa, spread=1.0):
    """Random keys or values quantized by qsdpa: (packed, scales, biases)."""
    w = (spread * rng.standard_normal((B, Hkv, N, D))).astype(dtype)
    return qsdpa.quantize(w, group, bits, backend="reference")
