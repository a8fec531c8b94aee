#!/usr/bin/env python3
"""PyTorch's scaled_dot_product_attention on an fp16 KV cache: the baseline `qsdpa bench` compares
its quantized-cache attention with.

For each shape it times F.scaled_dot_product_attention(q, k, v) with q [B, Hq, Lq, D] and an
unquantized cache k, v [B, Hkv, N, D] of the shape's dtype (f16 in the standard sweep), grouped-query
attention through enable_gqa=True (or, on a torch without it, by viewing q as [B, Hkv, rep*Lq, D],
which reads each KV head once as enable_gqa does). Lq > 1 rows sit at the end of the cache
(row i at position N - Lq + i) with a bottom-right causal mask. Timing: CUDA events around each
call, median of --iters calls after --warmup, inputs rotated over enough copies that one rotation
reads at least 5x the GPU's L2. Inputs are Gaussian, never zeros.

With --cold-l2, before each call (outside its events) a sum over a buffer of twice the L2 reads
other data, as `qsdpa bench --cold-l2` does before its own calls.

Usage: torch_sdpa.py --shapes FILE [--iters 100] [--warmup 10] [--cold-l2]
FILE holds {"shapes": [{"B":..,"Hq":..,"Hkv":..,"Lq":..,"N":..,"D":..,"dtype":"f16"}, ...]}.
Prints progress on stderr and, as its last line on stdout, a JSON array with one object per shape:
{"torch_time_us", "torch_gbps", "torch_bytes", "torch_variant", "torch_version"} or {"error"}.
"""
import argparse
import json
import math
import sys


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def bottom_right_causal(torch, lq, n, device):
    """[lq, n] bool, True where row i (at position n - lq + i) may see key t."""
    rows = torch.arange(lq, device=device).unsqueeze(1) + (n - lq)
    return torch.arange(n, device=device).unsqueeze(0) <= rows


def make_call(torch, F, s, q, k, v, mask_cache):
    """Returns (fn(q, k, v) -> out, variant name) for the fastest form this torch accepts."""
    B, Hq, Hkv, Lq, N, D = (s[x] for x in ("B", "Hq", "Hkv", "Lq", "N", "D"))
    rep = Hq // Hkv
    dev = q.device

    def gqa(qq, kk, vv):
        if Lq == 1:  # the one query row sees the whole cache
            return F.scaled_dot_product_attention(qq, kk, vv, enable_gqa=True)
        if "gqa" not in mask_cache:
            mask_cache["gqa"] = bottom_right_causal(torch, Lq, N, dev)
        return F.scaled_dot_product_attention(qq, kk, vv, attn_mask=mask_cache["gqa"], enable_gqa=True)

    def grouped(qq, kk, vv):
        # q heads of one KV head are consecutive: [B, Hq, Lq, D] -> [B, Hkv, rep * Lq, D].
        qg = qq.view(B, Hkv, rep * Lq, D)
        if Lq == 1:
            o = F.scaled_dot_product_attention(qg, kk, vv)
        else:
            if "grouped" not in mask_cache:
                mask_cache["grouped"] = bottom_right_causal(torch, Lq, N, dev).repeat(rep, 1)
            o = F.scaled_dot_product_attention(qg, kk, vv, attn_mask=mask_cache["grouped"])
        return o.view(B, Hq, Lq, D)

    for name, fn in (("enable_gqa", gqa), ("grouped-q view", grouped)):
        try:
            fn(q, k, v)
            torch.cuda.synchronize()
            return fn, name
        except (TypeError, RuntimeError) as e:  # enable_gqa is missing before torch 2.5
            log(f"  torch: {name} not usable here ({str(e).splitlines()[0]})")
    raise RuntimeError("no form of scaled_dot_product_attention ran on this shape")


def time_shape(torch, F, s, iters, warmup, l2_bytes, other=None):
    dtypes = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32}
    dt = dtypes[s.get("dtype", "f16")]
    B, Hq, Hkv, Lq, N, D = (int(s[x]) for x in ("B", "Hq", "Hkv", "Lq", "N", "D"))
    if Hkv <= 0 or Hq % Hkv:
        raise ValueError(f"Hq ({Hq}) is not a multiple of Hkv ({Hkv})")
    esize = torch.empty((), dtype=dt).element_size()
    per_call = (2 * B * Hkv * N * D + 2 * B * Hq * Lq * D) * esize  # K, V, q, out
    copies = max(1, min(64, math.ceil(5 * l2_bytes / per_call)))
    free, _ = torch.cuda.mem_get_info()
    copies = max(1, min(copies, int(0.7 * free // max(per_call, 1))))
    dev = torch.device("cuda")
    qs = [torch.randn(B, Hq, Lq, D, device=dev, dtype=dt) for _ in range(copies)]
    ks = [torch.randn(B, Hkv, N, D, device=dev, dtype=dt) for _ in range(copies)]
    vs = [torch.randn(B, Hkv, N, D, device=dev, dtype=dt) for _ in range(copies)]
    fn, variant = make_call(torch, F, {"B": B, "Hq": Hq, "Hkv": Hkv, "Lq": Lq, "N": N, "D": D},
                            qs[0], ks[0], vs[0], {})
    stream = torch.cuda.current_stream()
    def read_other():  # --cold-l2: L2 left holding other data before each call
        if other is not None:
            other.sum()

    for i in range(warmup):
        read_other()
        fn(qs[i % copies], ks[i % copies], vs[i % copies])
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    for i in range(iters):
        c = (warmup + i) % copies
        read_other()
        starts[i].record(stream)
        fn(qs[c], ks[c], vs[c])
        ends[i].record(stream)
    torch.cuda.synchronize()
    times = sorted(a.elapsed_time(b) * 1e3 for a, b in zip(starts, ends))
    n = len(times)
    med = times[n // 2] if n % 2 else 0.5 * (times[n // 2 - 1] + times[n // 2])
    del qs, ks, vs
    torch.cuda.empty_cache()
    return {"torch_time_us": med, "torch_gbps": per_call / med / 1e3, "torch_bytes": per_call,
            "torch_variant": variant, "torch_copies": copies, "torch_version": torch.__version__}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", required=True, help="JSON file with {'shapes': [...]}")
    ap.add_argument("--iters", type=int, default=100, help="timed calls per shape (at least 50)")
    ap.add_argument("--warmup", type=int, default=10, help="untimed calls first")
    ap.add_argument("--cold-l2", action="store_true",
                    help="before each call, read twice the L2 of other data (outside the timing)")
    args = ap.parse_args()
    with open(args.shapes) as f:
        shapes = json.load(f)["shapes"]
    iters = max(50, args.iters)

    import torch
    import torch.nn.functional as F
    if not torch.cuda.is_available():
        log("torch_sdpa: torch sees no GPU")
        print(json.dumps([{"error": "torch sees no GPU"} for _ in shapes]))
        return 1
    props = torch.cuda.get_device_properties(0)
    l2 = int(getattr(props, "L2_cache_size", 0) or (60 << 20))
    log(f"torch_sdpa: torch {torch.__version__} on {props.name}, L2 {l2 >> 20} MB, median of {iters}")

    # (int32 words: the sum reads each once; filled, so that the pages are real)
    other = torch.ones(2 * l2 // 4, dtype=torch.int32, device="cuda") if args.cold_l2 else None
    results, done = [], {}
    for s in shapes:
        key = tuple(s.get(x) for x in ("B", "Hq", "Hkv", "Lq", "N", "D", "dtype"))
        if key not in done:  # the 4-bit and 8-bit shapes share one fp16 baseline
            try:
                done[key] = time_shape(torch, F, s, iters, args.warmup, l2, other)
                log(f"  {key}: {done[key]['torch_time_us']:.2f} us ({done[key]['torch_variant']})")
            except Exception as e:  # one shape failing must not lose the others
                done[key] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"}
                log(f"  {key}: {done[key]['error']}")
                torch.cuda.empty_cache()
        results.append(done[key])
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
