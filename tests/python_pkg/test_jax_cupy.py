"""qsdpa on JAX and CuPy arrays (through DLPack): arrays of the same kind come back, on the same
device, and match the float64 NumPy reference. Skips with a reason where a framework, a GPU or
qsdpa's CUDA backend is missing.

JAX gets two CPU devices here (XLA_FLAGS, set before JAX starts its CPU backend, unless the
variable already asks for a count), so that the JAX CPU test also runs on a CPU device that is not
JAX's default one, even on machines without a GPU.
"""
import os

_XLA_CPU_COUNT = "--xla_force_host_platform_device_count"
if _XLA_CPU_COUNT not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + f" {_XLA_CPU_COUNT}=2").strip()

import numpy as np  # noqa: E402
import pytest  # noqa: E402

import qsdpa  # noqa: E402
from qsdpa_numpy_ref import BACKEND, assert_close_rows, attention64, dequantize64  # noqa: E402

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


def _devices(a):
    """The set of devices of a JAX array (jax.Array.devices(); older JAX: .device())."""
    if callable(getattr(a, "devices", None)):
        return set(a.devices())
    d = a.device
    return {d() if callable(d) else d}


def _jnp_dtype(dtype_name):
    import jax.numpy as jnp

    return {"float32": jnp.float32, "float16": jnp.float16, "bfloat16": jnp.bfloat16}[dtype_name]


def _host(a):
    """A JAX array as a NumPy array (ml_dtypes' bfloat16 for bfloat16)."""
    return np.asarray(a)


def _check_jax_array(jax, a, device, shape, dtype):
    assert isinstance(a, jax.Array), type(a)
    assert _devices(a) == {device}, (_devices(a), device)
    assert tuple(a.shape) == tuple(shape)
    assert np.dtype(a.dtype) == np.dtype(dtype), (a.dtype, dtype)


def _run_jax_case(jax, device, dtype_name, backend, *, B=2, Hq=8, Hkv=2, Lq=2, N=57, D=128,
                  seed=2, sinks=None, window=0, mask=None, mask_on_device=False):
    """quantize, dequantize and attention on JAX arrays on `device`, each output checked for its
    type, device, shape and dtype, and against NumPy: the quantizer bit for bit against qsdpa on
    NumPy arrays, dequantize exactly, attention against the float64 reference. `mask`: a NumPy
    bool mask that broadcasts to [B, Hq, Lq, N], passed as is or (mask_on_device) as a JAX array
    of the full shape on `device`."""
    import jax.numpy as jnp

    jdt = _jnp_dtype(dtype_name)
    q32, k32, v32 = make_numpy_case(np.float32, B=B, Hq=Hq, Hkv=Hkv, Lq=Lq, N=N, D=D, seed=seed)
    put = lambda a: jax.device_put(jnp.asarray(a, dtype=jdt), device)  # noqa: E731
    qj, kj, vj = put(q32), put(k32), put(v32)
    assert _devices(qj) == {device}
    q, k, v = _host(qj), _host(kj), _host(vj)  # the same values in NumPy (ml_dtypes bfloat16)

    kq = qsdpa.quantize(kj, 64, 4, backend=backend)
    vq = qsdpa.quantize(vj, 64, 4, backend=backend)
    for x, want in zip((*kq, *vq), ((B, Hkv, N, 16), (B, Hkv, N, 2), (B, Hkv, N, 2)) * 2):
        _check_jax_array(jax, x, device, want, np.uint32 if want[-1] == 16 else q.dtype)
    for a, b in zip((*kq, *vq), (*qsdpa.quantize(k, 64, 4, backend=BACKEND),
                                 *qsdpa.quantize(v, 64, 4, backend=BACKEND))):
        assert np.array_equal(_host(a).view(np.uint8), np.asarray(b).view(np.uint8))

    kd = qsdpa.dequantize(*kq, 64, 4, backend=backend)
    _check_jax_array(jax, kd, device, k.shape, q.dtype)
    want = qsdpa.dequantize(*(_host(x) for x in kq), 64, 4, backend=BACKEND)
    assert np.array_equal(_host(kd).view(np.uint8), np.asarray(want).view(np.uint8))

    full_mask = None if mask is None else np.broadcast_to(mask, (B, Hq, Lq, N)).copy()
    mask_arg = jax.device_put(full_mask, device) if mask_on_device and mask is not None else mask
    out = qsdpa.attention(qj, *kq, *vq, sinks=sinks, window=window, mask=mask_arg,
                          backend=backend)
    _check_jax_array(jax, out, device, q.shape, q.dtype)
    assert qsdpa.last_backend() == ("cuda" if backend == "auto" else backend)
    # The output is an ordinary JAX array: JAX computes with it on its device.
    doubled = out * 2
    assert _devices(doubled) == {device}
    assert np.array_equal(_host(doubled).astype(np.float64), _host(out).astype(np.float64) * 2)
    check(q, [_host(x) for x in kq], [_host(x) for x in vq], _host(out), dtype_name,
          sinks=None if sinks is None else np.asarray(sinks, np.float32), window=window,
          bool_mask=full_mask)


@pytest.mark.parametrize("which", ["first", "last"])
@pytest.mark.parametrize("dtype_name", ["float32", "float16", "bfloat16"])
def test_jax_cpu_arrays(dtype_name, which):
    """JAX arrays on a CPU device run on the host backend and come back on that device, also when
    JAX's default device is another one (a GPU, or the second CPU device)."""
    jax = _jax()
    try:
        cpus = jax.devices("cpu")
    except RuntimeError as e:
        pytest.skip(f"JAX has no CPU device: {e}")
    if which == "last" and len(cpus) < 2:
        pytest.skip("JAX has one CPU device (XLA_FLAGS came too late or sets another count)")
    cpu = cpus[0] if which == "first" else cpus[-1]
    mask = np.random.default_rng(7).random((2, 8, 2, 57)) < 0.8
    _run_jax_case(jax, cpu, dtype_name, BACKEND, seed=2, sinks=[0.5, -1.0, 2.0, 0.0] * 2,
                  window=30, mask=mask, mask_on_device=True)


def test_jax_cpu_arrays_not_on_the_default_device():
    """The case the first JAX CPU test missed: outputs followed JAX's default device."""
    jax = _jax()
    cpus = jax.devices("cpu")
    others = [d for d in cpus if d != jax.devices()[0]]
    if not others:
        pytest.skip("every JAX CPU device is the default device (one CPU device, no GPU)")
    _run_jax_case(jax, others[-1], "float32", BACKEND, seed=4)


def _jax_gpu(jax):
    if not CUDA_READY:
        pytest.skip("qsdpa's CUDA backend is not built or sees no device")
    try:
        gpus = jax.devices("gpu")
    except RuntimeError as e:
        pytest.skip(f"JAX sees no GPU: {e}")
    if not gpus:
        pytest.skip("JAX sees no GPU")
    return gpus[0]


@pytest.mark.parametrize("dtype_name", ["float32", "float16", "bfloat16"])
def test_jax_gpu_arrays(dtype_name, monkeypatch):
    """JAX arrays in GPU memory run on the CUDA backend; the outputs are JAX arrays on the same
    GPU, in memory from qsdpa._ext.cuda_empty (the outputs and the split-K workspace)."""
    jax = _jax()
    gpu = _jax_gpu(jax)
    allocs = []
    real = qsdpa._ext.cuda_empty

    def counting(shape, dtype, device):
        allocs.append((tuple(shape), dtype, device))
        return real(shape, dtype, device)

    monkeypatch.setattr(qsdpa._ext, "cuda_empty", counting)
    sinks = np.random.default_rng(1).uniform(-10, 10, 8).astype(np.float32)
    mask = np.random.default_rng(8).random((1, 1, 2, 57)) < 0.8  # NumPy: put on the GPU
    _run_jax_case(jax, gpu, dtype_name, "auto", seed=3, sinks=list(sinks), window=30, mask=mask)
    dl_id = int(jax.device_put(np.zeros(1, np.float32), gpu).__dlpack_device__()[1])
    assert all(dev == dl_id for _, _, dev in allocs)
    assert any(dt == "uint8" for _, dt, _ in allocs), "no workspace was allocated: " + str(allocs)


@pytest.mark.parametrize("dtype_name", ["float16", "bfloat16"])
def test_jax_gpu_long_cache_split_k(dtype_name):
    """A decode step over a long cache: few (b, KV head) pairs, so the CUDA backend splits the
    keys and combines the partials in the workspace that the package allocates for JAX."""
    jax = _jax()
    gpu = _jax_gpu(jax)
    _run_jax_case(jax, gpu, dtype_name, "auto", B=1, Hq=8, Hkv=2, Lq=1, N=8192, seed=5)


def test_jax_gpu_outputs_outlive_the_call():
    """Outputs stay valid after the package's references are gone, and are freed with JAX's."""
    jax = _jax()
    gpu = _jax_gpu(jax)
    import gc

    import jax.numpy as jnp

    k = make_numpy_case(np.float32, seed=6)[1]
    kj = jax.device_put(jnp.asarray(k, dtype=jnp.float16), gpu)
    first = [qsdpa.quantize(kj, 64, 4) for _ in range(3)]
    gc.collect()
    for kq in first:
        for a, b in zip(kq, first[0]):
            assert np.array_equal(np.asarray(a), np.asarray(b))
    del first
    gc.collect()
    again = qsdpa.quantize(kj, 64, 4)
    assert np.array_equal(np.asarray(again[0]),
                          np.asarray(qsdpa.quantize(np.asarray(kj), 64, 4, backend=BACKEND)[0]))


def test_jax_cpu_arrays_on_two_cpu_devices():
    """Two CPU devices are the same host memory to qsdpa: the call runs, the output follows q."""
    jax = _jax()
    cpus = jax.devices("cpu")
    if len(cpus) < 2:
        pytest.skip("JAX has one CPU device")
    q, k, v = make_numpy_case(np.float32)
    kq = qsdpa.quantize(jax.device_put(k, cpus[0]), 64, 4, backend=BACKEND)
    out = qsdpa.attention(jax.device_put(q, cpus[1]), *kq, *kq, backend=BACKEND)
    assert _devices(out) == {cpus[1]}


# ---- extension allocator and device errors (everywhere) -----------------------------------------


class _FakeDLPack:
    """An array-like object that says it lives on a given DLPack device."""

    def __init__(self, dev_type, module):
        self._dev = (dev_type, 0)
        type(self).__module__ = module

    def __dlpack__(self, **kw):  # never reached: the device is refused first
        raise AssertionError("__dlpack__ called")

    def __dlpack_device__(self):
        return self._dev


@pytest.mark.parametrize("module", ["jaxlib.fake", "mlx.fake", "somelib"])
@pytest.mark.parametrize("dev_type,where", [(10, "ROCm"), (8, "Metal"), (99, "unknown device")])
def test_other_devices_raise_type_error(module, dev_type, where):
    fake = type("FakeArray", (_FakeDLPack,), {})(dev_type, module)
    with pytest.raises(TypeError, match=f"q is a {module}.FakeArray on .*{where}.*DLPack device "
                                        f"type {dev_type}"):
        qsdpa.attention(fake, *([fake] * 6))
    with pytest.raises(TypeError, match=where):
        qsdpa.quantize(fake)


def test_gpu_arrays_of_unknown_frameworks_raise_type_error():
    fake = type("FakeArray", (_FakeDLPack,), {})(2, "somelib")
    with pytest.raises(TypeError, match="in GPU memory: qsdpa allocates GPU outputs only for "
                                        "PyTorch, CuPy and JAX"):
        qsdpa.dequantize(fake, fake, fake)


def test_cuda_empty():
    ext = qsdpa._ext
    with pytest.raises(TypeError, match="dtype \\('float64'\\)"):
        ext.cuda_empty((2, 3), "float64", 0)
    with pytest.raises(ValueError, match="negative"):
        ext.cuda_empty((2, -3), "float32", 0)
    if not qsdpa.backend_built("cuda"):
        with pytest.raises(RuntimeError, match="built without the CUDA backend"):
            ext.cuda_empty((2, 3), "float32", 0)
        with pytest.raises(RuntimeError, match="built without the CUDA backend"):
            ext.cuda_synchronize(0, 0)
        return
    if not CUDA_READY:  # built, but no device or driver: a CUDA error, said plainly
        with pytest.raises(RuntimeError, match="cudaMalloc of 24 bytes on cuda:0: cuda"):
            ext.cuda_empty((2, 3), "float32", 0)
        with pytest.raises(RuntimeError, match="cudaStreamSynchronize on cuda:0: cuda"):
            ext.cuda_synchronize(0, 0)
        return
    # A nanobind array (DLPack only: no shape attribute); JAX, where it sees the GPU, shows it.
    jax = None
    try:
        import jax

        gpus = jax.devices("gpu")
    except Exception:  # no JAX, or no GPU for it
        gpus = []
    for dtype in ("float32", "float16", "bfloat16", "uint32", "int32", "uint8"):
        a = ext.cuda_empty((2, 3, 5), dtype, 0)
        assert tuple(int(v) for v in a.__dlpack_device__()) == (2, 0)
        assert ext.dtype_name(a) == dtype
        if gpus:
            j = qsdpa._jax_from_dlpack(a)
            assert isinstance(j, jax.Array) and tuple(j.shape) == (2, 3, 5)
            assert np.dtype(j.dtype).name == dtype
            assert int(j.__dlpack_device__()[1]) == 0
    assert ext.dtype_name(ext.cuda_empty((0, 4), "float16", 0)) == "float16"
    ext.cuda_synchronize(0, 0)
