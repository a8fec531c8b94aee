// The internal interface between the public entry points (api.cpp) and the backends. Arguments
// reaching a backend have passed check_*() already; a backend still returns `unsupported` for a
// valid combination it does not implement.
#pragma once

#include <string>

#include "qsdpa/qsdpa.hpp"

namespace qsdpa::detail {

// Argument checks of SPEC section 5 (shapes, formats, pointers, byte-count overflow).
Status check_quantize(const QuantizeParams& p);
Status check_dequantize(const DequantizeParams& p);
Status check_attention(const AttentionParams& p);
Status check_append(const AppendParams& p);
// The values of kv_lens / q_lens / append's kv_lens, for backends whose memory the host reads.
Status check_lengths_host(const AttentionParams& p);
Status check_append_host(const AppendParams& p);

Status make_status(StatusCode c, std::string msg, Backend b = Backend::automatic);

// Host quantizer shared by the reference and CPU backends (it is defined bit-exactly by the SPEC).
Status host_quantize(const QuantizeParams& p);
Status host_dequantize(const DequantizeParams& p);
// Host append (reference and CPU backends): row by row through the host quantizer.
Status host_append(const AppendParams& p);

Status reference_attention(const AttentionParams& p);
Status cpu_attention(const AttentionParams& p);
Status cpu_quantize(const QuantizeParams& p);
Status cpu_dequantize(const DequantizeParams& p);

// CUDA backend (src/cuda, or stubs when it is not built).
bool cuda_built();
bool cuda_available(std::string* why);
bool cuda_is_device_pointer(const void* p);
std::string cuda_device_info();
Status cuda_attention(const AttentionParams& p);
Status cuda_quantize(const QuantizeParams& p);
Status cuda_dequantize(const DequantizeParams& p);
Status cuda_append(const AppendParams& p);
size_t cuda_attention_workspace_size(const AttentionParams& p);

}  // namespace qsdpa::detail

namespace qsdpa::detail {
// Row ranges of the host quantizer, for backends that split rows across threads.
void host_quantize_rows(const QuantizeParams& p, int64_t r0, int64_t r1);
void host_dequantize_rows(const DequantizeParams& p, int64_t r0, int64_t r1);
}  // namespace qsdpa::detail

namespace qsdpa::detail {
// The oracle's unrounded output ([B, Hq, Lq, D] doubles), for tests that compare against it.
void reference_attention_f64(const AttentionParams& p, double* out);
}  // namespace qsdpa::detail
