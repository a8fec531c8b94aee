"""qsdpa on PyTorch tensors: CPU tensors on the host backends, CUDA tensors on the CUDA backend
(zero copy, on PyTorch's current stream), checked against the float64 NumPy reference.

Skips with a reason where PyTorch, a GPU or qsdpa's CUDA backend is missing.
"""
import numpy as np
import pytest

import qsdpa
from qsdpa_numpy_ref import BACKEND, assert_close_rows, attention64, dequantize64

torch = pytest.importorskip("torch", reason="needs PyTorch")

HAS_GPU = torch.cuda.is_available()
CUDA_READY = HAS_GPU and qsdpa.backend_available("cuda")
if not HAS_GPU:
    NO_CUDA_REASON = "needs a CUDA GPU visible to PyTorch"
elif not qsdpa.backend_built("cuda"):
    NO_CUDA_REASON = "qsdpa was built without the CUDA backend (QSDPA_CUDA=OFF or no nvcc)"
else:
    NO_CUDA_REASON = "qsdpa's CUDA backend sees no device: " + qsdpa._ext.backend_available("cuda")[1]
needs_cuda = pytest.mark.skipif(not CUDA_READY, reason=NO_CUDA_REASON)

TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def np_of(t):
    """A tensor's values as float64 NumPy (packed words as uint32)."""
    t = t.detach().cpu()
    if t.dtype in (torch.int32, getattr(torch, "uint32", torch.int32)):
        return t.view(torch.int32).numpy().view(np.uint32)
    return t.to(torch.float64).numpy()


def make_case(dtype_name, device, *, B=2, Hq=8, Hkv=2, Lq=1, N=41, D=128, bits=4, group=64,
              seed=0):
    g = torch.Generator().manual_seed(seed)
    dt = TORCH_DTYPES[dtype_name]
    q = torch.randn(B, Hq, Lq, D, generator=g).to(dt).to(device)
    k = qsdpa.quantize(torch.randn(B, Hkv, N, D, generator=g).to(dt).to(device), group, bits)
    v = qsdpa.quantize(torch.randn(B, Hkv, N, D, generator=g).to(dt).to(device), group, bits)
    return q, k, v


def reference(q, k, v, bits, group, **kw):
    kd = dequantize64(*(np_of(x) for x in k), bits, group)
    vd = dequantize64(*(np_of(x) for x in v), bits, group)
    return attention64(np_of(q), kd, vd, **kw)


# ---- PyTorch on the CPU ---------------------------------------------------------------------------


@pytest.mark.parametrize("dtype_name", list(TORCH_DTYPES))
def test_cpu_tensors_in_cpu_tensors_out(dtype_name):
    q, k, v = make_case(dtype_name, "cpu", Lq=3)
    assert all(isinstance(x, torch.Tensor) and x.device.type == "cpu" for x in (*k, *v))
    assert k[1].dtype == TORCH_DTYPES[dtype_name] and k[0].shape == (2, 2, 41, 16)
    sinks = torch.empty(8).uniform_(-10, 10)
    out = qsdpa.attention(q, *k, *v, sinks=sinks, window=20, backend=BACKEND)
    assert isinstance(out, torch.Tensor) and out.dtype == q.dtype and out.shape == q.shape
    ref = reference(q, k, v, 4, 64, sinks=sinks.numpy(), window=20)
    assert_close_rows(np_of(out), ref, dtype_name)


def test_cpu_tensors_that_need_grad():
    q, k, v = make_case("float32", "cpu")
    q.requires_grad_(True)
    out = qsdpa.attention(q, *k, *v, backend=BACKEND)
    assert not out.requires_grad
    assert_close_rows(np_of(out), reference(q, k, v, 4, 64), "float32")


def test_cpu_quantize_matches_numpy():
    w = torch.randn(3, 7, 128).to(torch.float16)
    p, s, b = qsdpa.quantize(w, 32, 2)
    pn, sn, bn = qsdpa.quantize(w.numpy(), 32, 2)
    assert np.array_equal(np_of(p), pn)
    assert np.array_equal(s.numpy().view(np.uint16), sn.view(np.uint16))
    assert np.array_equal(b.numpy().view(np.uint16), bn.view(np.uint16))
    w2 = qsdpa.dequantize(p, s, b, 32, 2)
    assert isinstance(w2, torch.Tensor) and w2.dtype == torch.float16
    assert np.array_equal(w2.numpy(), qsdpa.dequantize(pn, sn, bn, 32, 2))


def test_cpu_masks_broadcast_and_non_contiguous():
    q, k, v = make_case("float32", "cpu", Lq=4, N=16, Hq=4, Hkv=4)
    qt = q.transpose(1, 2).contiguous().transpose(1, 2)  # same values, not contiguous
    assert not qt.is_contiguous()
    mask = torch.rand(4, 16) < 0.7  # [Lq, N] broadcasts to [B, Hq, Lq, N]
    fmask = torch.randn(1, 4, 4, 16, dtype=torch.float64)  # cast to q's dtype
    out = qsdpa.attention(qt, *k, *v, mask=mask, backend=BACKEND)
    ref = reference(q, k, v, 4, 64, bool_mask=np.broadcast_to(mask.numpy(), (2, 4, 4, 16)))
    assert_close_rows(np_of(out), ref, "float32")
    out = qsdpa.attention(q, *k, *v, mask=fmask, backend=BACKEND)
    ref = reference(q, k, v, 4, 64, float_mask=np.broadcast_to(
        fmask.to(torch.float32).numpy(), (2, 4, 4, 16)))
    assert_close_rows(np_of(out), ref, "float32")


def test_cuda_tensors_without_cuda_backend():
    if not HAS_GPU:
        pytest.skip("needs a CUDA GPU visible to PyTorch")
    if qsdpa.backend_built("cuda"):
        pytest.skip("qsdpa has the CUDA backend: the other tests run it")
    q, k, v = make_case("float16", "cpu")
    q, k, v = q.cuda(), [x.cuda() for x in k], [x.cuda() for x in v]
    with pytest.raises(RuntimeError, match="not built"):
        qsdpa.attention(q, *k, *v)
    with pytest.raises(ValueError, match="reads host memory"):
        qsdpa.attention(q, *k, *v, backend="cpu")


# ---- PyTorch on the GPU -------------------------------------------------------------------------


@needs_cuda
@pytest.mark.parametrize("dtype_name", list(TORCH_DTYPES))
@pytest.mark.parametrize("bits,group", [(2, 32), (4, 64), (8, 128), (4, 128)])
def test_cuda_quantize_is_bit_identical_to_cpu(dtype_name, bits, group):
    w = torch.randn(4, 6, 256).to(TORCH_DTYPES[dtype_name])
    cpu = qsdpa.quantize(w, group, bits, backend="reference")
    gpu = qsdpa.quantize(w.cuda(), group, bits)
    assert qsdpa.last_backend() == "cuda"
    assert all(x.is_cuda for x in gpu)
    for a, b in zip(cpu, gpu):
        assert torch.equal(a.view(torch.int16 if a.element_size() == 2 else torch.int32),
                           b.cpu().view(torch.int16 if b.element_size() == 2 else torch.int32))
    back = qsdpa.dequantize(*gpu, group, bits)
    assert back.is_cuda and back.dtype == w.dtype
    assert torch.equal(back.cpu(), qsdpa.dequantize(*cpu, group, bits, backend="reference"))


@needs_cuda
@pytest.mark.parametrize("dtype_name", list(TORCH_DTYPES))
@pytest.mark.parametrize("bits,group", [(2, 32), (4, 64), (8, 128)])
@pytest.mark.parametrize("Lq", [1, 4])
def test_cuda_attention(dtype_name, bits, group, Lq):
    q, k, v = make_case(dtype_name, "cuda", Lq=Lq, bits=bits, group=group, seed=bits * 10 + Lq)
    sinks = torch.empty(8).uniform_(-10, 10)
    out = qsdpa.attention(q, *k, *v, bits=bits, group_size=group, sinks=sinks.tolist())
    assert qsdpa.last_backend() == "cuda"
    assert out.is_cuda and out.device == q.device and out.dtype == q.dtype
    torch.cuda.synchronize()
    assert_close_rows(np_of(out), reference(q, k, v, bits, group, sinks=sinks.numpy()), dtype_name)


@needs_cuda
def test_cuda_deterministic_calls_repeat_their_bits():
    # a shape whose default plan takes the tile pool on an sm_90a device (B=8 Hkv=8 N=32768)
    q, k, v = make_case("float16", "cuda", B=8, Hq=32, Hkv=8, N=32768, seed=7)
    outs = [qsdpa.attention(q, *k, *v, deterministic=True) for _ in range(3)]
    torch.cuda.synchronize()
    for o in outs[1:]:
        assert torch.equal(o.view(torch.int16), outs[0].view(torch.int16))
    ref = reference(q[:1, :4], [x[:1, :1] for x in k], [x[:1, :1] for x in v], 4, 64)
    assert_close_rows(np_of(outs[0][:1, :4]), ref, "float16")


@needs_cuda
@pytest.mark.parametrize("D", [64, 96, 256, 512])
def test_cuda_head_dims(D):
    q, k, v = make_case("float16", "cuda", D=D, group=32, N=77, Lq=2)
    out = qsdpa.attention(q, *k, *v, group_size=32)
    assert_close_rows(np_of(out), reference(q, k, v, 4, 32), "float16")


@needs_cuda
@pytest.mark.parametrize("kind", ["bool", "uint8", "uint32", "float"])
def test_cuda_masks_and_window(kind):
    q, k, v = make_case("bfloat16", "cuda", Lq=5, N=300)
    shape = (2, 8, 5, 300)
    if kind == "float":
        m = torch.empty(shape).uniform_(-2, 2)
        m[torch.rand(shape) < 0.3] = float("-inf")
        m[..., 0] = float("-inf")
        m = m.to(torch.bfloat16)
        ref_kw = {"float_mask": np_of(m)}
    else:
        if kind == "uint32" and not hasattr(torch, "uint32"):
            pytest.skip("this PyTorch has no uint32")
        mb = torch.rand(shape) < 0.6
        m = mb if kind == "bool" else mb.to(torch.int32 if kind == "uint32" else torch.uint8)
        if kind == "uint32":
            m = m.view(torch.uint32)  # the same words
        ref_kw = {"bool_mask": mb.numpy()}
    out = qsdpa.attention(q, *k, *v, mask=m.cuda(), window=100)
    ref = reference(q, k, v, 4, 64, window=100, **ref_kw)
    assert_close_rows(np_of(out), ref, "bfloat16")


@needs_cuda
def test_cuda_long_cache_empty_cache_and_hidden_rows():
    q, k, v = make_case("float16", "cuda", B=1, Hq=4, Hkv=1, N=5000, Lq=1)
    out = qsdpa.attention(q, *k, *v)
    assert_close_rows(np_of(out), reference(q, k, v, 4, 64), "float16")
    hidden = torch.zeros(1, 4, 1, 5000, dtype=torch.bool, device="cuda")
    out = qsdpa.attention(q, *k, *v, mask=hidden, sinks=[1.0, 2.0, 3.0, 4.0])
    assert torch.count_nonzero(out).item() == 0
    empty = [x[:, :, :0] for x in k]
    out = qsdpa.attention(q, *empty, *empty)
    assert out.shape == q.shape and torch.count_nonzero(out).item() == 0


@needs_cuda
def test_cuda_runs_on_the_current_stream():
    """The call is enqueued on PyTorch's current stream: it works inside a side stream whose work
    the default stream has not seen, and it can be captured in a CUDA graph (capture fails on a
    launch to any other stream)."""
    q, k, v = make_case("float16", "cuda", Lq=1, N=200)
    ref = reference(q, k, v, 4, 64)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        q2 = q * 1.0  # written on the side stream
        out = qsdpa.attention(q2, *k, *v)
    side.synchronize()
    assert_close_rows(np_of(out), ref, "float16")

    static_q = q.clone()
    qsdpa.attention(static_q, *k, *v)  # warm-up outside the capture, as PyTorch advises
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = qsdpa.attention(static_q, *k, *v)
    static_q.copy_(q)
    graph.replay()
    torch.cuda.synchronize()
    assert_close_rows(np_of(static_out), ref, "float16")


@needs_cuda
def test_cuda_non_contiguous_and_broadcast_mask():
    q, k, v = make_case("float32", "cuda", Lq=3, N=64)
    qt = q.transpose(0, 1).contiguous().transpose(0, 1)
    assert not qt.is_contiguous()
    mask = torch.rand(1, 1, 3, 64, device="cuda") < 0.5
    out = qsdpa.attention(qt, *k, *v, mask=mask)
    ref = reference(q, k, v, 4, 64, bool_mask=np.broadcast_to(mask.cpu().numpy(), (2, 8, 3, 64)))
    assert_close_rows(np_of(out), ref, "float32")


@needs_cuda
def test_cuda_device_mismatch_and_host_backend():
    q, k, v = make_case("float16", "cuda")
    with pytest.raises(ValueError, match="all arrays must be on the same device"):
        qsdpa.attention(q, k[0].cpu(), k[1], k[2], *v)
    with pytest.raises(ValueError, match="reads host memory"):
        qsdpa.attention(q, *k, *v, backend="cpu")
    with pytest.raises(ValueError, match="reads GPU memory"):
        qsdpa.attention(q.cpu(), *(x.cpu() for x in k), *(x.cpu() for x in v), backend="cuda")


@needs_cuda
@pytest.mark.skipif(not HAS_GPU or torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_cuda_second_device():
    q, k, v = make_case("float16", "cuda:1")
    out = qsdpa.attention(q, *k, *v)
    assert out.device == q.device
    assert_close_rows(np_of(out), reference(q, k, v, 4, 64), "float16")

