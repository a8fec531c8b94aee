"""qsdpa on JAX and CuPy arrays (through DLPack): arrays of the same kind come back, on the same
device, and match the float64 NumPy reference. Skips with a reason where a framework, a GPU or
qsdpa's CUDA backend is missing.
"""
import numpy as np
import pytest

import qsdpa
from qsdpa_numpy_ref import BACKEND, assert_close_rows, attention64, dequantize64

CUDA_READY = qsdpa.backend_available("cuda")


def make_numpy_case(dtype, *, B=2, Hq=8, Hkv=2, Lq=2, N=57, D=128, seed=0):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((B, Hq, Lq, D)).astype(dtype)
    k = rng.standard_normal((B, Hkv, N, D)).astype(dtype)
    v = rng.standard_normal((B, Hkv, N, D)).astype(dtype)
    return q, k, v


def check(q_np, kq, vq, out, dtype_name, bits=4, group=64, **kw):
    kd = dequantize64(*(np.asarray(x) for x in kq), bits, group)
    vd = dequantize64(*(np.asarray(x) for x in vq), bits, group)
    ref = attention64(q_np, kd, vd, **kw)
    assert_close_rows(np.asarray(out).astype(np.float64), ref, dtype_name)


# ---- CuPy (GPU arrays: the CUDA backend, on CuPy's current stream) --------------------------------


@pytest.mark.parametrize("dtype_name", ["float32", "float16"])
def test_cupy_arrays(dtype_name):
    cupy = pytest.importorskip("cupy", reason="needs CuPy")
    if not CUDA_READY:
        pytest.skip("qsdpa's CUDA backend is not built or sees no device")
    q, k, v = make_numpy_case(np.dtype(dtype_name))
    kq = qsdpa.quantize(cupy.asarray(k), 64, 4)
    vq = qsdpa.quantize(cupy.asarray(v), 64, 4)
    assert all(isinstance(x, cupy.ndarray) for x in (*kq, *vq))
    # The GPU quantizer is bit-identical to the host one.
    for a, b in zip(kq, qsdpa.quantize(k, 64, 4, backend=BACKEND)):
        assert np.array_equal(cupy.asnumpy(a).view(np.uint8), np.asarray(b).view(np.uint8))
    sinks = np.random.default_rng(1).uniform(-10, 10, 8).astype(np.float32)
    out = qsdpa.attention(cupy.asarray(q), *kq, *vq, sinks=cupy.asarray(sinks), window=30)
    assert isinstance(out, cupy.ndarray) and out.dtype == q.dtype and out.shape == q.shape
    assert qsdpa.last_backend() == "cuda"
    check(q, [cupy.asnumpy(x) for x in kq], [cupy.asnumpy(x) for x in vq], cupy.asnumpy(out),
          dtype_name, sinks=sinks, window=30)


# ---- JAX (host arrays on the host backend; GPU arrays on the CUDA backend) ------------------------


def _jax():
    return pytest.importorskip("jax", reason="needs JAX")


@pytest.mark.parametrize("dtype_name", ["float32", "float16"])
def test_jax_cpu_arrays(dtype_name):
    jax = _jax()
    if jax.default_backend() != "cpu":
        # Known gap (seen on the H200 machine, 2026-11-29): where JAX's default device is a GPU,
        # the package allocates the outputs of a call on CPU arrays on that default device, and
        # the call is refused.
        pytest.xfail("outputs for JAX arrays follow JAX's default device, not the input's")
    try:
        cpu = jax.devices("cpu")[0]
    except RuntimeError as e:
        pytest.skip(f"JAX has no CPU device: {e}")
    q, k, v = make_numpy_case(np.dtype(dtype_name), seed=2)
    put = lambda a: jax.device_put(a, cpu)  # noqa: E731
    kq = qsdpa.quantize(put(k), 64, 4, backend=BACKEND)
    vq = qsdpa.quantize(put(v), 64, 4, backend=BACKEND)
    out = qsdpa.attention(put(q), *kq, *vq, backend=BACKEND)
    assert isinstance(out, jax.Array) and out.shape == q.shape and out.dtype == q.dtype
    check(q, kq, vq, out, dtype_name)


# Known gap: the package allocates GPU outputs only for PyTorch and CuPy, so JAX GPU arrays are
# refused with a TypeError (seen on the H200 machine, 2026-11-29).
@pytest.mark.xfail(strict=True, raises=TypeError, reason="JAX GPU arrays: no output allocation yet")
@pytest.mark.parametrize("dtype_name", ["float16", "bfloat16"])
def test_jax_gpu_arrays(dtype_name):
    jax = _jax()
    if not CUDA_READY:
        pytest.skip("qsdpa's CUDA backend is not built or sees no device")
    try:
        gpu = jax.devices("gpu")[0]
    except RuntimeError as e:
        pytest.skip(f"JAX sees no GPU: {e}")
    import jax.numpy as jnp

    jdt = jnp.float16 if dtype_name == "float16" else jnp.bfloat16
    q, k, v = make_numpy_case(np.float32, seed=3)
    put = lambda a: jax.device_put(jnp.asarray(a, dtype=jdt), gpu)  # noqa: E731
    kq = qsdpa.quantize(put(k), 64, 4)
    vq = qsdpa.quantize(put(v), 64, 4)
    qj = put(q)
    out = qsdpa.attention(qj, *kq, *vq)
    assert isinstance(out, jax.Array) and out.shape == q.shape and out.dtype == jdt
    assert qsdpa.last_backend() == "cuda"
    f32 = lambda a: np.asarray(jnp.asarray(a, dtype=jnp.float32)) if a.dtype == jdt else np.asarray(a)  # noqa: E731
    check(f32(qj), [f32(x) for x in kq], [f32(x) for x in vq], f32(out), dtype_name)
