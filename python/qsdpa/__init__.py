"""qsdpa: attention computed straight from an MLX-affine-quantized KV cache.

Three functions, taking any array that speaks DLPack and returning arrays of the same kind:

- ``quantize(w, group_size=64, bits=4)`` -> ``(packed, scales, biases)``, bit-identical to MLX's
  ``mx.quantize`` (same argument names and order);
- ``dequantize(packed, scales, biases, group_size=64, bits=4)`` -> ``w``, like ``mx.dequantize``;
- ``attention(q, k_packed, k_scales, k_biases, v_packed, v_scales, v_biases, ...)`` -> ``out``.

NumPy arrays run on the CPU; PyTorch CUDA tensors and CuPy arrays run on the GPU without a copy,
on the framework's current stream. Outputs are arrays of the inputs' kind on the inputs' device:

- PyTorch (CPU or CUDA) and CuPy: allocated by that framework;
- JAX arrays on a CPU device: computed into NumPy arrays, then put on the input's device
  (``jax.device_put``), whatever JAX's default device is;
- JAX arrays in GPU memory: the CUDA backend, zero copy. JAX does not expose its CUDA stream, so
  the inputs are waited for (``block_until_ready``), the outputs (and the split-K workspace) are
  device memory that qsdpa allocates (cudaMalloc; freed when JAX drops the array), the work runs
  on the legacy default stream of the array's device, and each call synchronizes that stream
  once before it hands the outputs to JAX (``jax.dlpack.from_dlpack``);
- other frameworks on the CPU: MLX arrays come back as MLX arrays, others as NumPy arrays.

Arrays on other devices (ROCm, Metal, ...), and GPU arrays of frameworks other than PyTorch, CuPy
and JAX, raise ``TypeError``. Element types: float32, float16 and bfloat16 (from PyTorch, JAX,
MLX or ``ml_dtypes``); packed words are uint32 (int32 is accepted).

Errors raise ``ValueError`` (a shape or value; the message is the library's), ``TypeError`` (a
dtype), ``NotImplementedError`` (a valid request the backend does not implement) or
``RuntimeError`` (a backend that is not built or has no device, or a failure inside it).
"""
from __future__ import annotations

import threading
from typing import Any, Optional, Tuple

import numpy as np

from . import _ext

__version__: str = _ext.__version__

__all__ = [
    "quantize",
    "dequantize",
    "attention",
    "last_backend",
    "build_info",
    "device_info",
    "backend_built",
    "backend_available",
]

# DLPack device types (DLDeviceType) the package tells apart.
_DL_CPU, _DL_CUDA, _DL_CUDA_HOST, _DL_CUDA_MANAGED = 1, 2, 3, 13
_DL_NAMES = {4: "OpenCL", 7: "Vulkan", 8: "Metal", 9: "VPI", 10: "ROCm", 11: "ROCm host",
             12: "ext_dev", 14: "oneAPI", 15: "WebGPU", 16: "Hexagon", 17: "MAIA"}

_last = threading.local()


def last_backend() -> Optional[str]:
    """The backend ('reference', 'cpu' or 'cuda') that ran the last successful call of this
    thread; useful with ``backend='auto'``. None before the first call."""
    return getattr(_last, "backend", None)


def build_info() -> str:
    """The library's build configuration (version, compiler, backends), one item a line."""
    return _ext.build_info()


def device_info() -> str:
    """The devices the library sees (CPU threads, CUDA devices), one a line."""
    return _ext.device_info()


def backend_built(name: str) -> bool:
    """Whether the backend ('auto', 'reference', 'cpu', 'cuda') was compiled into the library."""
    return _ext.backend_built(name)


def backend_available(name: str) -> bool:
    """Whether the backend can run here (for 'cuda': built and a device is present)."""
    return _ext.backend_available(name)[0]


# ---------------------------------------------------------------------------------------------
# Frameworks: what an input is, how to make it contiguous, how to allocate outputs like it.
# ---------------------------------------------------------------------------------------------


def _module_of(x: Any) -> str:
    return type(x).__module__.split(".")[0]


def _is_ml_bf16(dtype: Any) -> bool:
    """NumPy dtype of ml_dtypes' bfloat16 (NumPy itself has none)."""
    return isinstance(dtype, np.dtype) and dtype.kind == "V" and dtype.name == "bfloat16"


def _jax_device(x: Any, name: str) -> Any:
    """The device of a single-device JAX array: ``x.devices()`` (jax.Array), else ``x.device``
    (a property in recent JAX, a method in older versions)."""
    devices = getattr(x, "devices", None)
    if callable(devices):
        ds = list(devices())
        if len(ds) != 1:
            raise TypeError(f"{name} is a JAX array on {len(ds)} devices: qsdpa takes arrays on "
                            "one device")
        return ds[0]
    d = getattr(x, "device", None)
    return d() if callable(d) else d


def _jax_ready(a: Any) -> Any:
    """Waits until a JAX array's value has been computed (JAX dispatches asynchronously)."""
    wait = getattr(a, "block_until_ready", None)
    if callable(wait):
        wait()
    return a


class _Synchronized:
    """An extension array (from _ext.cuda_empty) whose writes are complete (its stream has been
    synchronized), as a DLPack producer: the consumer's stream needs no ordering, so the
    arguments of ``__dlpack__`` are accepted whatever nanobind's version would make of them."""

    __slots__ = ("_a",)

    def __init__(self, a: Any) -> None:
        self._a = a

    def __dlpack_device__(self) -> Any:
        return self._a.__dlpack_device__()

    def __dlpack__(self, *, stream: Any = None, max_version: Any = None, dl_device: Any = None,
                   copy: Any = None) -> Any:
        if copy:
            raise BufferError("__dlpack__(copy=True) is not supported")
        if dl_device is not None and tuple(int(v) for v in dl_device) != tuple(
                int(v) for v in self._a.__dlpack_device__()):
            raise BufferError("__dlpack__: unsupported dl_device")
        return self._a.__dlpack__()


def _jax_from_dlpack(a: Any) -> Any:
    """A JAX array viewing (zero copy) a synchronized extension array in GPU memory."""
    import jax.dlpack

    try:
        return jax.dlpack.from_dlpack(_Synchronized(a))
    except TypeError as e:  # old JAX: from_dlpack takes a DLPack capsule only
        try:
            return jax.dlpack.from_dlpack(a.__dlpack__())
        except Exception:
            raise e from None


def _np_bf16() -> Any:
    try:
        import ml_dtypes
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise TypeError("bfloat16 outputs on NumPy need the ml_dtypes package "
                        "(pip install ml_dtypes)") from e
    return np.dtype(ml_dtypes.bfloat16)


class _Kind:
    """The framework and device of a call, taken from its main input (w, packed or q)."""

    def __init__(self, x: Any, name: str) -> None:
        mod = _module_of(x)
        if isinstance(x, np.ndarray):
            self.fw = "numpy"
        elif mod == "torch":
            self.fw = "torch"
        elif mod == "cupy":
            self.fw = "cupy"
        elif hasattr(x, "__dlpack__"):
            self.fw = {"jax": "jax", "jaxlib": "jax", "mlx": "mlx"}.get(mod, "dlpack")
        else:
            raise TypeError(f"{name} ({type(x).__name__}) is not an array: pass a NumPy array, "
                            "a PyTorch tensor or another array that supports DLPack")
        self.x = x
        self.u16_is_bf16 = False  # set when a NumPy bfloat16 (ml_dtypes) array is passed on
        self.device: Any = None
        self.stream = 0
        # JAX arrays in GPU memory: the CUDA device (ordinal) whose memory qsdpa allocates the
        # outputs in (_ext.cuda_empty); None otherwise. The call runs on the legacy default
        # stream (0) of that device.
        self.cuda_device: Optional[int] = None
        self._keep: list = []  # buffers that must outlive the call's GPU work (the workspace)
        if self.fw == "torch":
            self.device = x.device
            if x.device.type == "cuda":
                import torch

                self.stream = int(torch.cuda.current_stream(x.device).cuda_stream)
        elif self.fw == "cupy":
            import cupy

            self.device = x.device
            with x.device:
                self.stream = int(cupy.cuda.get_current_stream().ptr)
        elif self.fw in ("jax", "mlx", "dlpack"):
            dev_type, dev_id = (int(v) for v in x.__dlpack_device__())
            what = f"{name} is a {type(x).__module__}.{type(x).__name__}"
            if self.fw == "jax":
                self.device = _jax_device(x, name)
                if dev_type == _DL_CUDA:
                    self.cuda_device = dev_id
                    return
            if dev_type in (_DL_CUDA, _DL_CUDA_MANAGED):
                raise TypeError(
                    f"{what} in GPU memory: qsdpa allocates GPU outputs only for PyTorch, CuPy and "
                    "JAX arrays; pass one of those, or host arrays")
            if dev_type not in (_DL_CPU, _DL_CUDA_HOST):
                where = _DL_NAMES.get(dev_type, "an unknown device")
                raise TypeError(
                    f"{what} on {where} (DLPack device type {dev_type}): qsdpa reads host (CPU) "
                    "memory and CUDA GPU memory only; move the arrays there")

    # -- inputs ----------------------------------------------------------------------------------

    def arg(self, a: Any, name: str) -> Any:
        """An input as the extension wants it: contiguous, and NumPy bfloat16 as uint16 bits."""
        if a is None:
            raise TypeError(f"{name} is None; expected an array")
        if isinstance(a, np.ndarray):
            a = np.ascontiguousarray(a)
            if _is_ml_bf16(a.dtype):
                self.u16_is_bf16 = True
                a = a.view(np.uint16)
            return a
        mod = _module_of(a)
        if mod == "torch":
            a = a.detach().contiguous()  # no autograd: DLPack refuses tensors that need grad
            if a.dtype == _torch_u32() and not _torch_u32_dlpack():
                a = a.view(_torch().int32)  # same bits; older PyTorch cannot export uint32
            return a
        if mod == "cupy":
            import cupy

            return cupy.ascontiguousarray(a)
        if hasattr(a, "__dlpack__"):
            # JAX computes asynchronously: the value must be there before the library reads it.
            return _jax_ready(a) if mod in ("jax", "jaxlib") else a
        if self.fw == "torch":  # lists and scalars next to torch tensors
            import torch

            return torch.as_tensor(a, device=self.device)
        return self.arg(np.asarray(a), name)

    # -- outputs ---------------------------------------------------------------------------------

    def dtype_of(self, a: Any) -> Any:
        """The dtype of an input (after arg()) in the output framework's terms (NumPy for host
        frameworks other than PyTorch)."""
        if isinstance(a, np.ndarray):
            return _np_bf16() if (self.u16_is_bf16 and a.dtype == np.uint16) else a.dtype
        if self.fw in ("torch", "cupy"):
            return a.dtype
        if self.fw == "jax":
            return np.dtype(a.dtype)
        name = _ext_dtype_name(a)
        return _np_bf16() if name == "bfloat16" else np.dtype(name)

    def local(self, a: np.ndarray) -> Any:
        """A NumPy helper input (sinks, a broadcast mask) on the call's device where the call's
        arrays are JAX arrays in GPU memory (the library reads all arrays of a call from one
        place); unchanged otherwise."""
        if self.cuda_device is None:
            return a
        import jax

        return jax.device_put(np.ascontiguousarray(a), self.device)

    def empty(self, shape: Tuple[int, ...], dtype: Any) -> Any:
        """An uninitialized output of the call's framework, on the call's device (JAX GPU arrays:
        device memory from the extension, wrapped for JAX by result())."""
        shape = tuple(max(0, int(s)) for s in shape)
        if self.cuda_device is not None:
            name = "uint32" if dtype == "uint32" else np.dtype(dtype).name
            return _ext.cuda_empty(shape, name, self.cuda_device)
        if self.fw == "torch":
            import torch

            if dtype == "uint32":
                dtype = _torch_u32() if _torch_u32_dlpack() else torch.int32
            return torch.empty(shape, dtype=dtype, device=self.device)
        if self.fw == "cupy":
            import cupy

            with self.device:
                return cupy.empty(shape, dtype=np.uint32 if dtype == "uint32" else dtype)
        return np.empty(shape, dtype=np.uint32 if dtype == "uint32" else dtype)

    def out_arg(self, a: Any) -> Any:
        if isinstance(a, np.ndarray) and _is_ml_bf16(a.dtype):
            self.u16_is_bf16 = True
            return a.view(np.uint16)
        return a

    def result(self, a: Any) -> Any:
        """An output converted to the input's framework (host frameworks compute into NumPy), on
        the input's device. Called after run(), which has synchronized any GPU work."""
        if self.fw == "jax":
            if self.cuda_device is not None:
                return _jax_from_dlpack(a)
            import jax

            return jax.device_put(a, self.device)  # not JAX's default device: the input's
        if self.fw == "mlx":
            import mlx.core as mx

            if _is_ml_bf16(a.dtype):
                return mx.array(a.view(np.uint16)).view(mx.bfloat16)
            return mx.array(a)
        return a

    def workspace_alloc(self) -> Any:
        """An allocator of GPU scratch bytes from the framework's own pool (PyTorch, CuPy), or
        from the extension (JAX GPU arrays; kept until run() has synchronized the stream)."""
        if self.cuda_device is not None:
            def alloc(n: int) -> Any:
                buf = _ext.cuda_empty((int(n),), "uint8", self.cuda_device)
                self._keep.append(buf)
                return buf

            return alloc
        if self.fw == "torch" and self.device.type == "cuda":
            torch = _torch()
            return lambda n: torch.empty(n, dtype=torch.uint8, device=self.device)
        if self.fw == "cupy":
            import cupy

            return lambda n: cupy.empty(n, dtype=cupy.uint8)
        return None

    def run(self, fn: Any, *args: Any, **kwargs: Any) -> None:
        """Calls the extension on the device of the inputs (PyTorch and CuPy GPUs; JAX GPU
        arrays: the legacy default stream, synchronized before returning, since the outputs go
        to JAX, which cannot be told to wait for a stream)."""
        if self.cuda_device is not None:
            try:
                backend = fn(*args, stream=self.stream, u16_is_bf16=self.u16_is_bf16, **kwargs)
                _ext.cuda_synchronize(self.cuda_device, self.stream)
            finally:
                self._keep.clear()  # (cudaFree also waits for the work still using it)
        elif self.fw == "torch" and self.device.type == "cuda":
            import torch

            with torch.cuda.device(self.device):
                backend = fn(*args, stream=self.stream, u16_is_bf16=self.u16_is_bf16, **kwargs)
        elif self.fw == "cupy":
            with self.device:
                backend = fn(*args, stream=self.stream, u16_is_bf16=self.u16_is_bf16, **kwargs)
        else:
            backend = fn(*args, stream=self.stream, u16_is_bf16=self.u16_is_bf16, **kwargs)
        _last.backend = backend


def _torch() -> Any:
    import torch

    return torch


def _torch_u32() -> Any:
    """torch.uint32 (PyTorch 2.3 and later), or None."""
    return getattr(_torch(), "uint32", None)


_TORCH_U32_DLPACK: Optional[bool] = None


def _torch_u32_dlpack() -> bool:
    """Whether this PyTorch has uint32 tensors and exports them through DLPack."""
    global _TORCH_U32_DLPACK
    if _TORCH_U32_DLPACK is None:
        u32 = _torch_u32()
        try:
            ok = u32 is not None and _ext.dtype_name(_torch().zeros(1, dtype=u32)) == "uint32"
        except Exception:  # an old PyTorch refuses the export: use int32 with the same bits
            ok = False
        _TORCH_U32_DLPACK = ok
    return _TORCH_U32_DLPACK


def _ext_dtype_name(a: Any) -> str:
    """The dtype of a DLPack array as a NumPy name ('float32', 'bfloat16', 'uint32', ...)."""
    return _ext.dtype_name(a)


def _shape(a: Any) -> Tuple[int, ...]:
    return tuple(int(s) for s in a.shape)


def _words(d: int, bits: int) -> int:
    return d * bits // 32 if bits > 0 else 0


def _groups(d: int, group_size: int) -> int:
    return d // group_size if group_size > 0 else 0


# ---------------------------------------------------------------------------------------------
# quantize / dequantize
# ---------------------------------------------------------------------------------------------


def quantize(w: Any, group_size: int = 64, bits: int = 4, *, backend: str = "auto"
             ) -> Tuple[Any, Any, Any]:
    """Quantizes ``w`` with MLX's affine scheme, bit for bit what ``mx.quantize`` returns.

    Args:
        w: ``[..., D]`` float32, float16 or bfloat16; ``D`` a multiple of ``group_size``.
        group_size: values sharing one scale and bias: 32, 64 or 128.
        bits: bits per value: 2, 4 or 8.
        backend: 'auto' (CUDA for GPU arrays, else CPU), 'cpu', 'reference' or 'cuda'.

    Returns:
        ``(packed, scales, biases)``: ``packed`` ``[..., D * bits / 32]`` uint32 (PyTorch: uint32
        where the installed version has it, else int32 with the same bits); ``scales`` and
        ``biases`` ``[..., D / group_size]`` in ``w``'s dtype. Element ``d`` of a row sits in
        word ``d // (32 // bits)`` at bit ``(d % (32 // bits)) * bits``; its value is
        ``scale * q + bias``.
    """
    kind = _Kind(w, "w")
    w = kind.arg(w, "w")
    shape = _shape(w)
    lead, d = (shape[:-1], shape[-1]) if shape else ((), 0)
    dtype = kind.dtype_of(w)
    packed = kind.empty(lead + (_words(d, bits),), "uint32")
    scales = kind.empty(lead + (_groups(d, group_size),), dtype)
    biases = kind.empty(lead + (_groups(d, group_size),), dtype)
    kind.run(_ext.quantize, w, packed, kind.out_arg(scales), kind.out_arg(biases),
             group_size=group_size, bits=bits, backend=backend)
    return kind.result(packed), kind.result(scales), kind.result(biases)


def dequantize(packed: Any, scales: Any, biases: Any, group_size: int = 64, bits: int = 4, *,
               backend: str = "auto") -> Any:
    """Dequantizes an affine-quantized array, like ``mx.dequantize``: ``w = scale * q + bias``
    (computed in float32, rounded to the dtype of ``scales``).

    Args:
        packed: ``[..., D * bits / 32]`` uint32 (or int32).
        scales: ``[..., D / group_size]`` float32, float16 or bfloat16.
        biases: ``[..., D / group_size]``, ``scales``' dtype.
        group_size: 32, 64 or 128.
        bits: 2, 4 or 8.
        backend: 'auto', 'cpu', 'reference' or 'cuda'.

    Returns:
        ``w``: ``[..., D]`` in ``scales``' dtype.
    """
    kind = _Kind(packed, "packed")
    packed = kind.arg(packed, "packed")
    scales = kind.arg(scales, "scales")
    biases = kind.arg(biases, "biases")
    shape = _shape(packed)
    lead, words = (shape[:-1], shape[-1]) if shape else ((), 0)
    d = words * (32 // bits) if bits in (1, 2, 4, 8, 16, 32) else words
    w = kind.empty(lead + (d,), kind.dtype_of(scales))
    kind.run(_ext.dequantize, packed, scales, biases, kind.out_arg(w), group_size=group_size,
             bits=bits, backend=backend)
    return kind.result(w)


# ---------------------------------------------------------------------------------------------
# attention
# ---------------------------------------------------------------------------------------------


def _prepare_mask(kind: _Kind, mask: Any, q: Any, target: Tuple[int, ...]) -> Any:
    """Broadcasts a mask to ``target`` = (B, Hq, Lq, N) and gives a float mask q's dtype
    (NumPy and PyTorch; other frameworks must pass the full shape and dtype)."""
    if isinstance(mask, np.ndarray) or (kind.fw == "numpy" and not hasattr(mask, "__dlpack__")):
        m = np.asarray(mask)
        if m.dtype.kind == "f" or _is_ml_bf16(m.dtype):
            qd = kind.dtype_of(q)
            if m.dtype != qd:
                m = m.astype(qd)
        try:
            m = np.broadcast_to(m, target)
        except ValueError:
            raise ValueError(f"mask has shape {tuple(m.shape)}; expected [B, Hq, Lq, N] = "
                             f"{target} or a shape that broadcasts to it") from None
        return kind.arg(kind.local(m), "mask")
    if _module_of(mask) == "torch":
        torch = _torch()
        if mask.is_floating_point() and mask.dtype != q.dtype:
            mask = mask.to(q.dtype)
        try:
            mask = mask.expand(target)
        except RuntimeError:
            raise ValueError(f"mask has shape {tuple(mask.shape)}; expected [B, Hq, Lq, N] = "
                             f"{target} or a shape that broadcasts to it") from None
        mask = mask.contiguous()
        if mask.dtype == torch.bool:
            mask = mask.view(torch.uint8)  # same bytes; older PyTorch cannot export bool
        return kind.arg(mask, "mask")
    return kind.arg(mask, "mask")


def _prepare_sinks(kind: _Kind, sinks: Any) -> Any:
    if kind.fw == "torch":
        import torch

        return torch.as_tensor(sinks, dtype=torch.float32, device=kind.device).contiguous()
    if kind.fw == "numpy" or not hasattr(sinks, "__dlpack__"):
        return kind.arg(kind.local(np.ascontiguousarray(sinks, dtype=np.float32)), "sinks")
    return kind.arg(sinks, "sinks")


def attention(q: Any, k_packed: Any, k_scales: Any, k_biases: Any, v_packed: Any, v_scales: Any,
              v_biases: Any, *, bits: int = 4, group_size: int = 64,
              k_bits: Optional[int] = None, v_bits: Optional[int] = None,
              k_group_size: Optional[int] = None, v_group_size: Optional[int] = None,
              scale: Optional[float] = None, sinks: Any = None, mask: Any = None,
              window: int = 0, backend: str = "auto", precision: str = "exact",
              num_threads: int = 0, deterministic: bool = False) -> Any:
    """Scaled dot-product attention of ``q`` over a quantized K/V cache (the MLX affine layout,
    as ``quantize`` / ``mx.quantize`` write it), always causal: query row ``i`` sits at position
    ``N - Lq + i`` and sees keys ``t <= N - Lq + i``.

    Args:
        q: ``[B, Hq, Lq, D]`` float32, float16 or bfloat16 (call it T); ``D`` a multiple of 32
            up to 512.
        k_packed, v_packed: ``[B, Hkv, N, D * bits / 32]`` uint32 (or int32); ``Hq % Hkv == 0``
            (query head ``h`` reads KV head ``h // (Hq // Hkv)``); ``Lq <= N`` unless ``N == 0``.
        k_scales, k_biases, v_scales, v_biases: ``[B, Hkv, N, D / group_size]``, dtype T.
        bits, group_size: the format of K and V (2/4/8 bits; groups of 32/64/128 values).
        k_bits, v_bits, k_group_size, v_group_size: per-cache formats (default: bits, group_size).
        scale: logit scale; None means ``1 / sqrt(D)``.
        sinks: optional ``[Hq]`` float32 (a list works too): one extra logit per head whose
            value vector is zero (it only enlarges the softmax denominator).
        mask: optional ``[B, Hq, Lq, N]`` (NumPy and PyTorch masks may have any shape that
            broadcasts to it). bool, uint8 or uint32 (int8, int32 too): 0 hides the key. float:
            added to the logit, ``-inf`` hides the key (converted to T).
        window: sliding window: key ``t`` visible when ``t > p - window``; 0 means none.
        backend: 'auto' (CUDA for GPU arrays, else CPU), 'cpu', 'reference' or 'cuda'.
        precision: 'exact' (the only mode offered so far).
        num_threads: CPU threads; 0 means all hardware threads.
        deterministic: the same output bits on every call with the same inputs. The host
            backends always give them (at a fixed ``num_threads``); on CUDA the default plan of
            the large 4- and 2-bit D = 128 calls lets a block's warps take the cache's tiles as
            they come free, which changes the output's last bits from call to call (within the
            accuracy bound); True plans without that, at ~1-2 % of speed.

    Returns:
        ``out``: ``[B, Hq, Lq, D]``, dtype T, same framework and device as ``q``. A row that sees
        no key (everything masked, ``N == 0``) is all zeros. For JAX arrays in GPU memory the
        call runs on the legacy default CUDA stream and synchronizes it once before returning
        (JAX does not expose its stream); NumPy sinks and masks are moved to ``q``'s device.
    """
    kind = _Kind(q, "q")
    q = kind.arg(q, "q")
    args = [kind.arg(a, n) for a, n in ((k_packed, "k_packed"), (k_scales, "k_scales"),
                                         (k_biases, "k_biases"), (v_packed, "v_packed"),
                                         (v_scales, "v_scales"), (v_biases, "v_biases"))]
    qs = _shape(q)
    ks = _shape(args[0])
    out = kind.empty(qs, kind.dtype_of(q))
    if sinks is not None:
        sinks = _prepare_sinks(kind, sinks)
    if mask is not None:
        if len(qs) == 4 and len(ks) == 4:
            mask = _prepare_mask(kind, mask, q, (qs[0], qs[1], qs[2], ks[2]))
        else:
            mask = kind.arg(mask, "mask")
    kb = bits if k_bits is None else k_bits
    vb = bits if v_bits is None else v_bits
    kg = group_size if k_group_size is None else k_group_size
    vg = group_size if v_group_size is None else v_group_size
    kind.run(_ext.attention, q, *args, kind.out_arg(out), sinks=sinks, mask=mask, k_bits=kb,
             k_group_size=kg, v_bits=vb, v_group_size=vg,
             scale=0.0 if scale is None else float(scale), window=int(window), backend=backend,
             precision=precision, num_threads=int(num_threads),
             workspace_alloc=kind.workspace_alloc(), deterministic=bool(deterministic))
    return kind.result(out)
