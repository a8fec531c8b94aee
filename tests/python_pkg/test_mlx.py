"""qsdpa against MLX (the `mlx` + `mlx-cpu` packages): the quantizer bit for bit, the dequantizer
to the last place, and attention over mx.quantize'd caches against mx.fast.scaled_dot_product_attention
on mx.dequantize'd keys and values.
"""
import inspect
import math

import numpy as np
import pytest

import qsdpa
from qsdpa_numpy_ref import (BACKEND, assert_close_rows, attention64, dequantize64, f64,
                             np_dtype, ulp)

mx = pytest.importorskip("mlx.core", reason="needs MLX: pip install mlx mlx-cpu")
ml_dtypes = pytest.importorskip("ml_dtypes", reason="needs ml_dtypes for bfloat16 on NumPy")

MX_DTYPES = {"float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16}
DTYPES = list(MX_DTYPES)


def to_np(a):
    """An MLX array as NumPy (bfloat16 through its bits)."""
    if a.dtype == mx.bfloat16:
        return np.array(a.view(mx.uint16)).view(ml_dtypes.bfloat16)
    return np.array(a)


def to_mx(a):
    if a.dtype == np.dtype(ml_dtypes.bfloat16):
        return mx.array(a.view(np.uint16)).view(mx.bfloat16)
    return mx.array(a)


def same_bits(a, b):
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    return a.shape == b.shape and a.dtype == b.dtype and np.array_equal(a.view(np.uint8),
                                                                         b.view(np.uint8))


def hard_groups(rng, rows, D, group):
    """Rows whose groups are of many kinds: Gaussian at several magnitudes, constant, zero, one
    outlier, one-signed, integer grids (ties in the rounding), tiny (the 1e-7 scale floor)."""
    w = rng.standard_normal((rows, D))
    g = w.reshape(rows, D // group, group)
    kinds = rng.integers(0, 8, size=g.shape[:2])
    for (r, j), kind in np.ndenumerate(kinds):
        x = g[r, j]
        if kind == 0:
            x *= 10.0 ** rng.integers(-6, 4)  # finite in float16
        elif kind == 1:
            x[:] = rng.standard_normal()
        elif kind == 2:
            x[:] = 0.0
        elif kind == 3:
            x[rng.integers(group)] = 50.0
        elif kind == 4:
            x[:] = np.abs(x) + 1.0
        elif kind == 5:
            x[:] = rng.integers(-8, 8, group) * 0.5
        elif kind == 6:
            x *= 1e-9
    return w


# ---- quantize / dequantize -----------------------------------------------------------------------


@pytest.mark.parametrize("dtype_name", DTYPES)
@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("group", [32, 64, 128])
def test_quantize_is_bit_identical(rng, dtype_name, bits, group):
    w = hard_groups(rng, 24, 256, group).astype(np.float32)
    wm = mx.array(w).astype(MX_DTYPES[dtype_name])
    wn = to_np(wm).reshape(2, 3, 4, 256)  # leading dimensions are kept
    mp, ms, mb = mx.quantize(wm.reshape(2, 3, 4, 256), group, bits)
    p, s, b = qsdpa.quantize(wn, group, bits, backend=BACKEND)
    assert p.dtype == np.uint32 and s.dtype == np_dtype(dtype_name)
    assert same_bits(p, to_np(mp))
    assert same_bits(s, to_np(ms))
    assert same_bits(b, to_np(mb))


@pytest.mark.parametrize("dtype_name", DTYPES)
@pytest.mark.parametrize("bits", [2, 4, 8])
def test_dequantize_matches_mlx(rng, dtype_name, bits):
    wm = mx.array(rng.standard_normal((5, 7, 128)).astype(np.float32)).astype(MX_DTYPES[dtype_name])
    mp, ms, mb = mx.quantize(wm, 64, bits)
    ours = qsdpa.dequantize(to_np(mp), to_np(ms), to_np(mb), 64, bits, backend=BACKEND)
    theirs = to_np(mx.dequantize(mp, ms, mb, 64, bits))
    assert ours.dtype == theirs.dtype and ours.shape == theirs.shape
    # qsdpa rounds s * q + z to T once (from float32); MLX's CPU kernel computes in T and rounds
    # s * q first: apart by at most that rounding plus one unit in the last place, equal in f32.
    exact = dequantize64(to_np(mp), to_np(ms), to_np(mb), bits, 64)
    sq = exact - np.repeat(f64(to_np(mb)), 64, axis=-1)
    bound = 0.5 * ulp(sq, dtype_name) + ulp(exact, dtype_name)
    assert np.all(np.abs(f64(ours) - f64(theirs)) <= bound)
    if dtype_name == "float32":
        assert same_bits(ours, theirs)


def test_mlx_arrays_in_mlx_arrays_out(rng):
    """MLX arrays speak DLPack: they go in directly, and the results are MLX arrays."""
    wm = mx.array(rng.standard_normal((2, 4, 9, 64)).astype(np.float32)).astype(mx.bfloat16)
    p, s, b = qsdpa.quantize(wm, 32, 4, backend=BACKEND)
    assert isinstance(p, mx.array) and p.dtype == mx.uint32 and s.dtype == mx.bfloat16
    mp, ms, mb = mx.quantize(wm, 32, 4)
    assert mx.array_equal(p, mp).item() and mx.array_equal(s, ms).item()
    assert mx.array_equal(b, mb).item()
    q = mx.array(rng.standard_normal((2, 8, 1, 64)).astype(np.float32)).astype(mx.bfloat16)
    out = qsdpa.attention(q, p, s, b, p, s, b, group_size=32, backend=BACKEND)
    assert isinstance(out, mx.array) and out.dtype == mx.bfloat16 and out.shape == (2, 8, 1, 64)
    kd = dequantize64(to_np(p), to_np(s), to_np(b), 4, 32)
    assert_close_rows(to_np(out), attention64(to_np(q), kd, kd), "bfloat16")


# ---- attention -----------------------------------------------------------------------------------


def sdpa_takes_sinks():
    """Whether the installed MLX's sdpa has a sinks= argument (MLX 0.29 and later)."""
    f = mx.fast.scaled_dot_product_attention
    try:
        return "sinks" in inspect.signature(f).parameters
    except (TypeError, ValueError):  # a compiled function without a signature: its docstring
        return "sinks" in (f.__doc__ or "").split("->")[0]


def mlx_case(rng, dtype_name, *, B, Hq, Hkv, Lq, N, D, bits, group, sinks=False, mask=None,
             window=0):
    """qsdpa.attention over mx.quantize'd K/V against MLX's sdpa on mx.dequantize'd K/V.

    Two MLX evaluations: in T (what an MLX user runs: dequantized values rounded to T, T
    arithmetic), where each side is within the SPEC bound of the truth, hence within twice the
    bound of each other; and in float32 on the exact dequantized values (the SPEC's semantics),
    which is within the bound itself.
    """
    mdt = MX_DTYPES[dtype_name]

    def draw(*shape):
        return mx.array(rng.standard_normal(shape).astype(np.float32)).astype(mdt)

    q = draw(B, Hq, Lq, D)
    kq = mx.quantize(draw(B, Hkv, N, D), group, bits)
    vq = mx.quantize(draw(B, Hkv, N, D), group, bits)
    scale = 1.0 / math.sqrt(D)

    # Visibility (causal + window + boolean mask) as MLX sees it, and qsdpa's arguments.
    pos = N - Lq + np.arange(Lq)
    t = np.arange(N)
    visible = np.broadcast_to((t[None, :] <= pos[:, None]), (B, Hq, Lq, N)).copy()
    if window:
        visible &= t[None, :] > pos[:, None] - window
    kw = {}
    add = None
    if mask == "bool":
        m = rng.random((B, Hq, Lq, N)) < 0.6
        m[:, :, np.arange(Lq), pos] = True  # the key at the row's own position: never a row of nothing
        visible &= m
        kw["mask"] = m
    elif mask == "float":
        add = rng.uniform(-3, 3, (B, Hq, Lq, N)).astype(np.float32)
        add = to_np(mx.array(add).astype(mdt))  # representable in T
        kw["mask"] = add
    sink_vals = None
    if sinks:
        sink_vals = to_np(mx.array(rng.uniform(-10, 10, Hq).astype(np.float32)).astype(mdt))
        kw["sinks"] = f64(sink_vals).astype(np.float32)

    def mlx_sdpa(qm, km, vm, dt):
        if add is None:
            mmask = mx.array(visible)
        else:
            mmask = mx.array(np.where(visible, f64(add), -np.inf).astype(np.float32)).astype(dt)
        extra = {}
        if sinks:
            extra["sinks"] = mx.array(f64(sink_vals).astype(np.float32)).astype(dt)
        return mx.fast.scaled_dot_product_attention(qm, km, vm, scale=scale, mask=mmask, **extra)

    out_t = mlx_sdpa(q, mx.dequantize(*kq, group, bits), mx.dequantize(*vq, group, bits), mdt)

    def deq32(c):
        return mx.dequantize(c[0], c[1].astype(mx.float32), c[2].astype(mx.float32), group, bits)

    out_32 = mlx_sdpa(q.astype(mx.float32), deq32(kq), deq32(vq), mx.float32)

    ours = qsdpa.attention(to_np(q), *map(to_np, kq), *map(to_np, vq), bits=bits,
                           group_size=group, window=window, backend=BACKEND, **kw)
    assert ours.dtype == np_dtype(dtype_name)
    assert_close_rows(ours, f64(to_np(out_32)), dtype_name)
    assert_close_rows(ours, f64(to_np(out_t)), dtype_name, tol_factor=2.0)


@pytest.mark.parametrize("dtype_name", DTYPES)
@pytest.mark.parametrize("bits,group", [(2, 32), (4, 64), (8, 128), (4, 32)])
def test_attention_matches_mlx_sdpa(rng, dtype_name, bits, group):
    mlx_case(rng, dtype_name, B=2, Hq=8, Hkv=2, Lq=1, N=45, D=128, bits=bits, group=group)


@pytest.mark.parametrize("dtype_name", DTYPES)
def test_attention_matches_mlx_sdpa_prefill_masks(rng, dtype_name):
    mlx_case(rng, dtype_name, B=1, Hq=4, Hkv=4, Lq=6, N=30, D=64, bits=4, group=64, mask="bool",
             window=9)
    mlx_case(rng, dtype_name, B=2, Hq=4, Hkv=1, Lq=3, N=20, D=96, bits=8, group=32, mask="float")


@pytest.mark.parametrize("dtype_name", DTYPES)
def test_attention_matches_mlx_sdpa_sinks(rng, dtype_name):
    if not sdpa_takes_sinks():
        pytest.skip("the installed MLX's scaled_dot_product_attention has no sinks= argument")
    mlx_case(rng, dtype_name, B=2, Hq=8, Hkv=2, Lq=2, N=33, D=128, bits=4, group=64, sinks=True)
