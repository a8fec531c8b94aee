// Placeholder until the multithreaded CPU backend lands.
#include "../core/backends.hpp"
namespace qsdpa::detail {
Status cpu_attention(const AttentionParams&) { return make_status(StatusCode::unsupported, "cpu backend: not yet implemented", Backend::cpu); }
Status cpu_quantize(const QuantizeParams& p) { return host_quantize(p); }
Status cpu_dequantize(const DequantizeParams& p) { return host_dequantize(p); }
}  // namespace qsdpa::detail
