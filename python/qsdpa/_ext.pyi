"""Type stubs of qsdpa's compiled core (python/qsdpa_ext.cpp).

Use the functions of the `qsdpa` package: they allocate the outputs with the framework of the
inputs and pass them here. Arrays are any object that speaks DLPack (NumPy, PyTorch, JAX, CuPy,
MLX): contiguous, on one device; outputs writable. Each function returns the backend that ran.
"""
from typing import Any, Callable, Optional, Tuple

__version__: str

def quantize(w: Any, packed: Any, scales: Any, biases: Any, group_size: int, bits: int,
             backend: str, stream: int, u16_is_bf16: bool) -> str:
    """w [..., D] -> packed [..., D*bits/32] u32, scales and biases [..., D/group_size]."""

def dequantize(packed: Any, scales: Any, biases: Any, w: Any, group_size: int, bits: int,
               backend: str, stream: int, u16_is_bf16: bool) -> str:
    """packed [..., D*bits/32], scales and biases [..., D/group_size] -> w [..., D]."""

def attention(q: Any, k_packed: Any, k_scales: Any, k_biases: Any, v_packed: Any, v_scales: Any,
              v_biases: Any, out: Any, sinks: Optional[Any], mask: Optional[Any], k_bits: int,
              k_group_size: int, v_bits: int, v_group_size: int, scale: float, window: int,
              backend: str, precision: str, num_threads: int, stream: int, u16_is_bf16: bool,
              workspace_alloc: Optional[Callable[[int], Any]] = None) -> str:
    """q [B, Hq, Lq, D], K/V [B, Hkv, N, ...], sinks [Hq], mask [B, Hq, Lq, N] -> out
    [B, Hq, Lq, D]."""

def dtype_name(a: Any) -> str:
    """The dtype of a DLPack array as a NumPy name ('float32', 'bfloat16', 'uint32', ...)."""

def build_info() -> str: ...
def device_info() -> str: ...
def backend_built(name: str) -> bool: ...
def backend_available(name: str) -> Tuple[bool, str]: ...
