"""Bad arguments raise Python exceptions with the library's message; nothing crashes."""
import re

import numpy as np
import pytest

import qsdpa
from qsdpa import _ext
from qsdpa_numpy_ref import BACKEND


def cache(B=1, Hkv=2, N=8, D=64, dtype=np.float16, bits=4, group=64):
    w = np.random.default_rng(0).standard_normal((B, Hkv, N, D)).astype(dtype)
    return qsdpa.quantize(w, group, bits, backend="reference")


def q_of(B=1, Hq=4, Lq=1, D=64, dtype=np.float16):
    return np.random.default_rng(1).standard_normal((B, Hq, Lq, D)).astype(dtype)


def attn(q, k, v=None, **kw):
    kw.setdefault("backend", BACKEND)
    return qsdpa.attention(q, *k, *(v or k), **kw)


# ---- the library's own rules (SPEC section 5), with its messages --------------------------------


@pytest.mark.parametrize("bits", [0, 3, 16])
def test_bad_bits(bits):
    w = np.ones((2, 64), np.float32)
    msg = f"bits ({bits}) is not supported: use 2, 4 or 8"
    with pytest.raises(ValueError, match=re.escape(msg)):
        qsdpa.quantize(w, 64, bits)
    with pytest.raises(ValueError, match=re.escape(msg)):
        qsdpa.dequantize(np.zeros((2, 8), np.uint32), np.ones((2, 1), np.float32),
                         np.ones((2, 1), np.float32), 64, bits)
    with pytest.raises(ValueError, match=re.escape(f"k.format.bits ({bits}) is not supported")):
        attn(q_of(), cache(), bits=bits)


def test_bad_group():
    with pytest.raises(ValueError, match=re.escape("group (48) is not supported: use 32, 64 or 128")):
        qsdpa.quantize(np.ones((2, 96), np.float32), 48, 4)
    with pytest.raises(ValueError, match=re.escape("v.format.group (16) is not supported")):
        attn(q_of(), cache(), v_group_size=16)


def test_dim_not_multiple_of_group():
    with pytest.raises(ValueError, match=re.escape("dim (96) is not a multiple of group (64)")):
        qsdpa.quantize(np.ones((2, 96), np.float32), 64, 4)


def test_bad_head_dim():
    k = cache(D=32, group=32)
    with pytest.raises(ValueError, match=re.escape("D (48) is not supported")):
        attn(q_of(D=48), k, group_size=32)


def test_heads_not_divisible():
    k = cache(Hkv=5, D=64)
    with pytest.raises(ValueError, match=re.escape("Hq (12) is not a multiple of Hkv (5)")):
        attn(q_of(Hq=12), k)


def test_more_queries_than_keys():
    with pytest.raises(ValueError, match=re.escape("Lq (5) is larger than N (3)")):
        attn(q_of(Lq=5), cache(N=3))


def test_negative_window_and_scale():
    with pytest.raises(ValueError, match=re.escape("window (-1) is negative")):
        attn(q_of(), cache(), window=-1)
    with pytest.raises(ValueError, match="scale .* must be positive"):
        attn(q_of(), cache(), scale=-1.0)


def test_fast_precision_is_not_offered():
    with pytest.raises(NotImplementedError, match="precision \\(fast\\)"):
        attn(q_of(), cache(), precision="fast")


def test_negative_threads():
    if BACKEND != "cpu":
        pytest.skip("num_threads is a cpu backend argument")
    with pytest.raises(ValueError, match="num_threads"):
        attn(q_of(), cache(), num_threads=-2)


# ---- the binding's rules: ranks, shapes that tie the arrays together, dtypes, devices ------------


def test_shape_mismatches():
    k = cache()
    with pytest.raises(ValueError, match=re.escape("q has shape (4, 1, 64)")):
        attn(q_of()[0], k)
    with pytest.raises(ValueError, match=re.escape("k_scales has shape (1, 2, 8, 2); expected (1, 2, 8, 1)")):
        attn(q_of(), (k[0], np.ones((1, 2, 8, 2), np.float16), k[2]))
    with pytest.raises(ValueError, match="v_packed has shape"):
        attn(q_of(), k, (k[0][:, :, :7].copy(), k[1], k[2]))
    with pytest.raises(ValueError, match=re.escape("k_packed has shape (2, 2, 8, 8)")):
        attn(q_of(), (np.zeros((2, 2, 8, 8), np.uint32), k[1], k[2]))
    with pytest.raises(ValueError, match="k_packed has shape .*expected 4 dimensions"):
        attn(q_of(), (k[0][0], k[1], k[2]))
    # A packed width that does not match the bits.
    with pytest.raises(ValueError, match=re.escape("k_packed has shape (1, 2, 8, 8); expected (1, 2, 8, 16)")):
        attn(q_of(), k, bits=8)


def test_dequantize_shape_mismatch():
    p, s, b = qsdpa.quantize(np.ones((3, 128), np.float32))
    with pytest.raises(ValueError, match="biases has shape"):
        qsdpa.dequantize(p, s, b[:2])
    with pytest.raises(ValueError, match="scales has shape"):
        qsdpa.dequantize(p, s, b, group_size=32)  # the groups are 64 wide


def test_dtype_mismatches():
    k = cache()
    with pytest.raises(TypeError, match=re.escape("k_scales has dtype float32; expected float16 (the dtype of q)")):
        attn(q_of(), (k[0], k[1].astype(np.float32), k[2]))
    with pytest.raises(TypeError, match=re.escape("k_packed has dtype float32; expected uint32")):
        attn(q_of(), (k[0].astype(np.float32), k[1], k[2]))
    with pytest.raises(TypeError, match=re.escape("q has dtype int32; expected float32, float16 or bfloat16")):
        attn(q_of().astype(np.int32), k)
    with pytest.raises(TypeError, match="w has dtype float64"):
        qsdpa.quantize(np.ones((2, 64)))
    with pytest.raises(TypeError, match="sinks has dtype"):
        _ext.attention(q_of(), *k, *k, np.empty((1, 4, 1, 64), np.float16),
                       sinks=np.zeros(4, np.float64), mask=None, k_bits=4, k_group_size=64,
                       v_bits=4, v_group_size=64, scale=0.0, window=0, backend="cpu",
                       precision="exact", num_threads=0, stream=0, u16_is_bf16=False)


def test_int32_packed_words_are_accepted():
    k = cache()
    a = attn(q_of(), k)
    b = attn(q_of(), (k[0].view(np.int32), k[1], k[2]))
    assert np.array_equal(a, b)


def test_masks():
    k = cache()
    with pytest.raises(TypeError, match=re.escape("mask has dtype int64; expected bool, uint8 or uint32")):
        attn(q_of(), k, mask=np.ones((1, 4, 1, 8), np.int64))
    with pytest.raises(ValueError, match=re.escape("mask has shape (3, 8); expected [B, Hq, Lq, N] = (1, 4, 1, 8)")):
        attn(q_of(), k, mask=np.ones((3, 8), bool))


def test_sinks_shape():
    with pytest.raises(ValueError, match=re.escape("sinks has shape (3,); expected (4,) = [Hq]")):
        attn(q_of(), cache(), sinks=[1.0, 2.0, 3.0])


def test_bad_backend_names():
    with pytest.raises(ValueError, match="backend \\('gpu'\\) is not one of"):
        attn(q_of(), cache(), backend="gpu")
    with pytest.raises(ValueError, match="precision \\('slow'\\)"):
        attn(q_of(), cache(), precision="slow")
    with pytest.raises(ValueError, match="backend \\('x'\\)"):
        qsdpa.backend_built("x")


def test_cuda_backend_on_host_arrays():
    if not qsdpa.backend_built("cuda"):
        with pytest.raises(RuntimeError, match="not built"):
            attn(q_of(), cache(), backend="cuda")
    else:
        with pytest.raises(ValueError, match="reads GPU memory"):
            attn(q_of(), cache(), backend="cuda")


def test_not_an_array():
    with pytest.raises(TypeError, match="q \\(str\\) is not an array"):
        qsdpa.attention("q", *cache(), *cache())
    with pytest.raises(TypeError, match="k_scales is None"):
        k = cache()
        qsdpa.attention(q_of(), k[0], None, k[2], *k)


def test_extension_refuses_non_contiguous_and_read_only_outputs():
    """The compiled layer never copies: a strided array is an error there (the package makes
    NumPy and PyTorch inputs contiguous before calling it)."""
    w = np.ones((4, 128), np.float32)[:, ::2]
    args = dict(group_size=64, bits=4, backend="cpu", stream=0, u16_is_bf16=False)
    with pytest.raises(ValueError, match="w is not contiguous"):
        _ext.quantize(w, np.empty((4, 8), np.uint32), np.empty((4, 1), np.float32),
                      np.empty((4, 1), np.float32), **args)
    ro = np.empty((4, 8), np.uint32)
    ro.flags.writeable = False
    with pytest.raises(TypeError):
        _ext.quantize(np.ones((4, 64), np.float32), ro, np.empty((4, 1), np.float32),
                      np.empty((4, 1), np.float32), **args)


def test_read_only_inputs_are_fine():
    w = np.ones((4, 64), np.float32)
    w.flags.writeable = False
    p, s, b = qsdpa.quantize(w)
    for a in (p, s, b):
        a.flags.writeable = False
    assert qsdpa.dequantize(p, s, b).shape == (4, 64)


def test_nan_inputs_do_not_crash():
    q = q_of()
    q[0, 0, 0, 0] = np.nan
    out = attn(q, cache())
    assert out.shape == q.shape
