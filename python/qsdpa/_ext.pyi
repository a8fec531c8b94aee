"""Type stubs of qsdpa's compiled core (python/qsdpa_ext.cpp).

Use the functions of the `qsdpa` package: they allocate the outputs with the framework of the
inputs and pass them here. Arrays are any object that speaks DLPack (NumPy, PyTorch, JAX, CuPy,
MLX): contiguous, on one device; outputs writable. quantize, dequantize and attention return the
backend that ran.
"""
from typing import Any, Callable, Optional, Sequence, Tuple

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
              workspace_alloc: Optional[Callable[[int], Any]] = None,
              deterministic: bool = False) -> str:
    """q [B, Hq, Lq, D], K/V [B, Hkv, N, ...], sinks [Hq], mask [B, Hq, Lq, N] -> out
    [B, Hq, Lq, D]."""

def cuda_empty(shape: Sequence[int], dtype: str, device: int) -> Any:
    """An uninitialized C-contiguous array (DLPack device type CUDA, device ``device``) of
    ``shape`` and ``dtype`` ('float32', 'float16', 'bfloat16', 'uint32', 'int32', 'uint8'), from
    cudaMalloc; cudaFree releases it when the last array that views it (through DLPack too) is
    gone. The package allocates JAX GPU outputs and workspaces with it. RuntimeError where the
    CUDA backend is not built or the allocation fails."""

def cuda_synchronize(device: int, stream: int) -> None:
    """Waits for the work queued on ``stream`` (a cudaStream_t as an integer; 0: the legacy
    default stream) of CUDA device ``device``. RuntimeError where the CUDA backend is not built
    or on a CUDA error."""

def dtype_name(a: Any) -> str:
    """The dtype of a DLPack array as a NumPy name ('float32', 'bfloat16', 'uint32', ...)."""

def build_info() -> str: ...
def device_info() -> str: ...
def backend_built(name: str) -> bool: ...
def backend_available(name: str) -> Tuple[bool, str]: ...
