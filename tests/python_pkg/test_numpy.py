"""qsdpa on NumPy arrays against an independent float64 NumPy evaluation of the SPEC.

Runs on the host backend named by QSDPA_TEST_BACKEND (default: cpu).
"""
import numpy as np
import pytest

import qsdpa
from qsdpa_numpy_ref import (BACKEND, BF16, assert_close_rows, attention64, dequantize64, f64,
                             np_dtype, random_cache, ulp, unpack)

DTYPES = ["float32", "float16", "bfloat16"]


def run_case(rng, dtype_name, *, B=1, Hq=4, Hkv=2, Lq=1, N=37, D=128, k_fmt=(4, 64),
             v_fmt=None, scale=None, sinks=False, bool_mask=None, float_mask=False, window=0,
             mask_shape=None):
    """Draws a case, runs qsdpa.attention and checks it against attention64; returns out."""
    dt = np_dtype(dtype_name)
    v_fmt = v_fmt or k_fmt
    q = rng.standard_normal((B, Hq, Lq, D)).astype(dt)
    k = random_cache(rng, B, Hkv, N, D, dt, k_fmt[0], k_fmt[1], qsdpa)
    v = random_cache(rng, B, Hkv, N, D, dt, v_fmt[0], v_fmt[1], qsdpa)
    kw = {}
    ref_kw = {"scale": scale, "window": window}
    if scale is not None:
        kw["scale"] = scale
    if sinks:
        s = rng.uniform(-10, 10, Hq).astype(np.float32)
        kw["sinks"] = s
        ref_kw["sinks"] = s
    full = (B, Hq, Lq, N)
    shape = mask_shape or full
    if bool_mask is not None:
        m = rng.random(shape) < 0.7
        kw["mask"] = m if bool_mask == "bool" else m.astype(bool_mask)
        ref_kw["bool_mask"] = np.broadcast_to(m, full)
    if float_mask:
        m = rng.uniform(-2, 2, shape)
        m[rng.random(shape) < 0.25] = -np.inf
        m[..., 0] = -np.inf  # a hidden key first: never a NaN
        m = m.astype(dt)
        kw["mask"] = m
        ref_kw["float_mask"] = np.broadcast_to(m, full)
    out = qsdpa.attention(q, *k, *v, k_bits=k_fmt[0], k_group_size=k_fmt[1], v_bits=v_fmt[0],
                          v_group_size=v_fmt[1], window=window, backend=BACKEND, **kw)
    assert isinstance(out, np.ndarray)
    assert out.shape == (B, Hq, Lq, D) and out.dtype == dt
    kd = dequantize64(*k, *k_fmt)
    vd = dequantize64(*v, *v_fmt)
    ref = attention64(q, kd, vd, **ref_kw)
    assert_close_rows(out, ref, dtype_name)
    assert qsdpa.last_backend() == BACKEND
    return out, ref


@pytest.mark.parametrize("dtype_name", DTYPES)
@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("group", [32, 64, 128])
def test_formats(rng, dtype_name, bits, group):
    run_case(rng, dtype_name, k_fmt=(bits, group))


def test_deterministic_flag(rng):
    """deterministic=True reaches the library (an unknown keyword raises TypeError), and the host
    backend gives the same bits with it and without it."""
    dt = np_dtype("float16")
    q = rng.standard_normal((2, 8, 2, 128)).astype(dt)
    k = random_cache(rng, 2, 2, 300, 128, dt, 4, 64, qsdpa)
    v = random_cache(rng, 2, 2, 300, 128, dt, 4, 64, qsdpa)
    outs = [qsdpa.attention(q, *k, *v, backend=BACKEND, deterministic=d) for d in (True, True, False)]
    for o in outs[1:]:
        assert np.array_equal(o.view(np.uint16), outs[0].view(np.uint16))
    assert_close_rows(outs[0], attention64(q, dequantize64(*k, 4, 64), dequantize64(*v, 4, 64)), "float16")


@pytest.mark.parametrize("D", [32, 64, 96, 160, 256, 512])
def test_head_dims(rng, D):
    run_case(rng, "float16", D=D, k_fmt=(4, 32), N=19)


@pytest.mark.parametrize("dtype_name", DTYPES)
def test_gqa_batch_prefill_window_sinks(rng, dtype_name):
    run_case(rng, dtype_name, B=2, Hq=8, Hkv=2, Lq=5, N=29, window=7, sinks=True)


@pytest.mark.parametrize("mask_type", ["bool", np.uint8, np.uint32])
def test_bool_masks(rng, mask_type):
    run_case(rng, "float32", B=2, Lq=3, N=21, bool_mask=mask_type, sinks=True)


@pytest.mark.parametrize("dtype_name", DTYPES)
def test_float_mask(rng, dtype_name):
    run_case(rng, dtype_name, Lq=4, N=25, float_mask=True)


def test_mask_broadcasts(rng):
    # [Lq, N] and [1, Hq, Lq, N] masks broadcast to [B, Hq, Lq, N].
    run_case(rng, "float16", B=2, Lq=3, N=17, bool_mask="bool", mask_shape=(3, 17))
    run_case(rng, "float32", B=2, Lq=3, N=17, float_mask=True, mask_shape=(1, 4, 3, 17))


def test_float_mask_is_cast_to_q_dtype(rng):
    q = rng.standard_normal((1, 2, 1, 64)).astype(np.float16)
    k = random_cache(rng, 1, 1, 9, 64, np.float16, 4, 64, qsdpa)
    m64 = rng.uniform(-1, 1, (1, 2, 1, 9))  # float64: becomes float16
    out = qsdpa.attention(q, *k, *k, mask=m64, backend=BACKEND)
    ref = attention64(q, dequantize64(*k, 4, 64), dequantize64(*k, 4, 64),
                      float_mask=m64.astype(np.float16))
    assert_close_rows(out, ref, "float16")


def test_k_and_v_formats_differ(rng):
    run_case(rng, "float16", k_fmt=(8, 32), v_fmt=(2, 128), Lq=2, N=33)


def test_explicit_scale(rng):
    run_case(rng, "float32", scale=0.37)


def test_all_masked_rows_and_empty_cache(rng):
    dt = np.float16
    q = rng.standard_normal((1, 2, 2, 64)).astype(dt)
    k = random_cache(rng, 1, 2, 6, 64, dt, 4, 64, qsdpa)
    mask = np.zeros((1, 2, 2, 6), bool)
    out = qsdpa.attention(q, *k, *k, mask=mask, sinks=[3.0, -1.0], backend=BACKEND)
    assert np.array_equal(out, np.zeros_like(out))
    # N == 0: every row sees nothing.
    e = (np.zeros((1, 2, 0, 8), np.uint32), np.zeros((1, 2, 0, 1), dt), np.zeros((1, 2, 0, 1), dt))
    out = qsdpa.attention(q, *e, *e, backend=BACKEND)
    assert out.shape == (1, 2, 2, 64) and np.array_equal(out, np.zeros_like(out))


def test_non_contiguous_inputs_are_made_contiguous(rng):
    dt = np.float32
    qt = rng.standard_normal((1, 1, 64, 4)).astype(dt)
    q = qt.transpose(0, 3, 1, 2)  # [1, 4, 1, 64], not contiguous
    assert not q.flags.c_contiguous
    k = random_cache(rng, 1, 2, 11, 64, dt, 4, 32, qsdpa)
    out = qsdpa.attention(q, *k, *k, group_size=32, backend=BACKEND)
    ref = attention64(q, dequantize64(*k, 4, 32), dequantize64(*k, 4, 32))
    assert_close_rows(out, ref, "float32")


def test_auto_backend_on_numpy_runs_on_the_cpu(rng):
    q = rng.standard_normal((1, 2, 1, 64)).astype(np.float32)
    k = random_cache(rng, 1, 1, 5, 64, np.float32, 4, 64, qsdpa)
    qsdpa.attention(q, *k, *k)
    assert qsdpa.last_backend() == "cpu"


def test_backends_agree(rng):
    dt = np.float16
    q = rng.standard_normal((2, 4, 3, 128)).astype(dt)
    k = random_cache(rng, 2, 2, 40, 128, dt, 4, 64, qsdpa)
    v = random_cache(rng, 2, 2, 40, 128, dt, 8, 64, qsdpa)
    a = qsdpa.attention(q, *k, *v, v_bits=8, backend="reference")
    b = qsdpa.attention(q, *k, *v, v_bits=8, backend=BACKEND, num_threads=2)
    ref = attention64(q, dequantize64(*k, 4, 64), dequantize64(*v, 8, 64))
    assert_close_rows(a, ref, "float16")
    assert_close_rows(b, ref, "float16")


# ---- quantize / dequantize -----------------------------------------------------------------------


@pytest.mark.parametrize("dtype_name", DTYPES)
@pytest.mark.parametrize("bits", [2, 4, 8])
def test_quantize_roundtrip(rng, dtype_name, bits):
    dt = np_dtype(dtype_name)
    w = rng.standard_normal((3, 5, 128)).astype(dt)
    packed, scales, biases = qsdpa.quantize(w, 32, bits, backend=BACKEND)
    assert packed.shape == (3, 5, 128 * bits // 32) and packed.dtype == np.uint32
    assert scales.shape == biases.shape == (3, 5, 4)
    assert scales.dtype == biases.dtype == dt
    # Codes fit in `bits`; values come back within about a step (MLX's scheme moves the scale so
    # that one edge of the group is exact, and rounds it to T; test_mlx.py checks it bit for bit).
    back = dequantize64(packed, scales, biases, bits, 32)
    span = np.repeat(np.ptp(f64(w).reshape(3, 5, 4, 32), axis=-1), 32, axis=-1)
    assert np.all(np.abs(back - f64(w)) <= 1.5 * span / (2 ** bits - 1) + 1e-6)
    assert unpack(packed, bits).max() < 2 ** bits
    # qsdpa.dequantize: s * q + z computed in float32 and rounded to T once.
    w2 = qsdpa.dequantize(packed, scales, biases, 32, bits, backend=BACKEND)
    assert w2.shape == w.shape and w2.dtype == dt
    s32 = np.repeat(scales.astype(np.float32), 32, axis=-1)
    z32 = np.repeat(biases.astype(np.float32), 32, axis=-1)
    expect = (s32 * unpack(packed, bits).astype(np.float32) + z32).astype(dt)
    assert np.array_equal(w2.view(np.uint8), expect.view(np.uint8))


def test_quantize_backends_agree(rng):
    w = (rng.standard_normal((7, 256)) * 3).astype(np.float16)
    a = qsdpa.quantize(w, backend="reference")
    b = qsdpa.quantize(w, backend=BACKEND)
    for x, y in zip(a, b):
        assert np.array_equal(x.view(np.uint8), y.view(np.uint8))


def test_quantize_1d():
    p, s, b = qsdpa.quantize(np.linspace(-1, 1, 64, dtype=np.float32), bits=8)
    assert p.shape == (16,) and s.shape == b.shape == (1,)


def test_quantize_empty_rows():
    p, s, b = qsdpa.quantize(np.zeros((0, 64), np.float32))
    assert p.shape == (0, 8) and s.shape == (0, 1)


@pytest.mark.skipif(BF16 is None, reason="needs ml_dtypes for bfloat16 on NumPy")
def test_bfloat16_dequantize_matches_float32_math(rng):
    w = rng.standard_normal((4, 64)).astype(BF16)
    p, s, b = qsdpa.quantize(w, 64, 4)
    w2 = qsdpa.dequantize(p, s, b, 64, 4)
    assert w2.dtype == BF16
    diff = np.abs(f64(w2) - dequantize64(p, s, b, 4, 64))
    assert np.all(diff <= ulp(dequantize64(p, s, b, 4, 64), "bfloat16"))


def test_info_functions():
    assert "qsdpa" in qsdpa.build_info()
    assert "cpu" in qsdpa.device_info()
    assert qsdpa.backend_built("cpu") and qsdpa.backend_available("reference")
    assert isinstance(qsdpa.backend_available("cuda"), bool)
    assert qsdpa.__version__ in qsdpa.build_info()
