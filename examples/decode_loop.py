#!/usr/bin/env python3
"""A small attention layer decoding token by token over a quantized KV cache.

Each step projects the new token's hidden state to a query (Hq heads) and a key and value (Hkv
heads, grouped-query attention), quantizes the new key and value rows with qsdpa.quantize, appends
them to the cache, and runs qsdpa.attention over the whole cache. The same layer runs beside it
with a plain fp16 cache; at the end the script prints the memory of both caches and how far the
layer's outputs are apart.

PyTorch on a CUDA GPU when present (qsdpa's CUDA backend, on PyTorch's stream), NumPy on the CPU
otherwise (or with --numpy).

    python3 examples/decode_loop.py [--steps 256] [--bits 4] [--group-size 64] [--numpy]
"""
import argparse
import math
import sys
import time

import numpy as np

import qsdpa

B, HQ, HKV, D = 1, 8, 2, 128  # sequences, query heads, key/value heads, head dim
HIDDEN = 512  # the model's hidden size


def use_torch(force_numpy):
    if force_numpy:
        return None
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() and qsdpa.backend_available("cuda") else None


class NumpyOps:
    """The few array operations the loop needs, on NumPy."""

    name = "NumPy on the CPU"

    def __init__(self, seed):
        self.rng = np.random.default_rng(seed)

    def randn(self, *shape):
        return self.rng.standard_normal(shape).astype(np.float16)

    def weight(self, rows, cols):
        """A projection matrix, kept in float32 (NumPy has no fast float16 matmul)."""
        return (self.rng.standard_normal((rows, cols)) / math.sqrt(rows)).astype(np.float32)

    def matmul(self, x, w):
        return (x.astype(np.float32) @ w).astype(np.float16)

    def cat(self, a, b):
        return b if a is None else np.concatenate([a, b], axis=2)

    def f32(self, x):
        return x.astype(np.float32)

    def softmax_attention(self, q, k, v):
        """fp16 cache reference: softmax(q k^T / sqrt(D)) v, accumulated in float32."""
        rep = HQ // HKV
        k = np.repeat(k.astype(np.float32), rep, axis=1)
        v = np.repeat(v.astype(np.float32), rep, axis=1)
        s = q.astype(np.float32) @ k.swapaxes(-1, -2) / math.sqrt(D)
        w = np.exp(s - s.max(axis=-1, keepdims=True))
        return ((w / w.sum(axis=-1, keepdims=True)) @ v).astype(np.float16)

    def nbytes(self, *arrays):
        return sum(a.nbytes for a in arrays)

    def sync(self):
        pass


class TorchOps(NumpyOps):
    """The same operations on PyTorch CUDA tensors."""

    def __init__(self, torch, seed):
        self.torch = torch
        self.gen = torch.Generator(device="cuda").manual_seed(seed)
        self.name = f"PyTorch on {torch.cuda.get_device_name()}"

    def randn(self, *shape):
        return self.torch.randn(*shape, generator=self.gen, device="cuda").half()

    def weight(self, rows, cols):
        return self.randn(rows, cols) / math.sqrt(rows)

    def matmul(self, x, w):
        return x @ w

    def cat(self, a, b):
        if b.dtype == getattr(self.torch, "uint32", None):
            b = b.view(self.torch.int32)  # packed words: int32 has every PyTorch operation
        return b if a is None else self.torch.cat([a, b], dim=2)

    def f32(self, x):
        return x.float().cpu().numpy()

    def softmax_attention(self, q, k, v):
        rep = HQ // HKV
        k = k.float().repeat_interleave(rep, dim=1)
        v = v.float().repeat_interleave(rep, dim=1)
        s = q.float() @ k.transpose(-1, -2) / math.sqrt(D)
        return (self.torch.softmax(s, dim=-1) @ v).half()

    def nbytes(self, *tensors):
        return sum(t.numel() * t.element_size() for t in tensors)

    def sync(self):
        self.torch.cuda.synchronize()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=256, help="tokens to decode")
    ap.add_argument("--bits", type=int, default=4, choices=[2, 4, 8])
    ap.add_argument("--group-size", type=int, default=64, choices=[32, 64, 128])
    ap.add_argument("--numpy", action="store_true", help="NumPy on the CPU even with a GPU")
    args = ap.parse_args()

    torch = use_torch(args.numpy)
    ops = TorchOps(torch, 0) if torch else NumpyOps(0)
    wq, wk, wv = (ops.weight(HIDDEN, n) for n in (HQ * D, HKV * D, HKV * D))
    wo = ops.weight(HQ * D, HIDDEN)
    # Hidden states of one context share a direction (as real ones do) plus a token's own part.
    context = ops.randn(B, HIDDEN)

    cache_q = [None] * 6  # k_packed, k_scales, k_biases, v_packed, v_scales, v_biases
    cache_k = cache_v = None  # the fp16 cache
    rel = []
    t0 = time.perf_counter()
    for _ in range(args.steps):
        x = context + ops.randn(B, HIDDEN) * 0.5  # the new token's hidden state
        q = ops.matmul(x, wq).reshape(B, HQ, 1, D)
        k = ops.matmul(x, wk).reshape(B, HKV, 1, D)
        v = ops.matmul(x, wv).reshape(B, HKV, 1, D)

        # Quantized cache: quantize the new rows, append them, attend over the whole cache.
        new = (*qsdpa.quantize(k, args.group_size, args.bits),
               *qsdpa.quantize(v, args.group_size, args.bits))
        cache_q = [ops.cat(c, n) for c, n in zip(cache_q, new)]
        out_q = qsdpa.attention(q, *cache_q, bits=args.bits, group_size=args.group_size)

        # fp16 cache, for comparison.
        cache_k, cache_v = ops.cat(cache_k, k), ops.cat(cache_v, v)
        out_ref = ops.softmax_attention(q, cache_k, cache_v)

        yq = ops.f32(ops.matmul(out_q.reshape(B, HQ * D), wo))
        yr = ops.f32(ops.matmul(out_ref.reshape(B, HQ * D), wo))
        rel.append(float(np.linalg.norm(yq - yr) / np.linalg.norm(yr)))
    ops.sync()
    elapsed = time.perf_counter() - t0

    fp16_bytes = ops.nbytes(cache_k, cache_v)
    quant_bytes = ops.nbytes(*cache_q)
    print(f"qsdpa decode loop: {ops.name}, backend {qsdpa.last_backend()}, {args.steps} tokens, "
          f"Hq={HQ} Hkv={HKV} D={D}, {args.bits}-bit groups of {args.group_size}")
    print(f"KV cache after {args.steps} tokens: fp16 {fp16_bytes / 1024:.1f} KiB, quantized "
          f"{quant_bytes / 1024:.1f} KiB ({fp16_bytes / quant_bytes:.2f}x smaller, "
          f"{100 * (1 - quant_bytes / fp16_bytes):.1f}% saved)")
    print(f"layer output vs the fp16 cache: relative difference mean {np.mean(rel):.2e}, "
          f"max {np.max(rel):.2e}, last step {rel[-1]:.2e}")
    print(f"{args.steps} steps in {elapsed:.2f} s (both caches, with the comparison)")
    # A loose sanity bound: quantization noise, not a wrong result.
    limit = {2: 0.5, 4: 0.15, 8: 0.02}[args.bits]
    if not np.max(rel) < limit:
        print(f"FAIL: the difference exceeds {limit} for {args.bits}-bit caches", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
