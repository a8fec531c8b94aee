// The CUDA entry points when the library is built without CUDA: every call says so.
#include "backends.hpp"

namespace qsdpa::detail {

namespace {
Status not_built() {
  return make_status(StatusCode::not_built,
                     "backend (cuda) is not built into this library: configure with -DQSDPA_CUDA=ON",
                     Backend::cuda);
}
}  // namespace

bool cuda_built() { return false; }
bool cuda_available(std::string* why) {
  if (why) *why = "the CUDA backend is not built";
  return false;
}
bool cuda_is_device_pointer(const void*) { return false; }
std::string cuda_device_info() { return "cuda: not built\n"; }
Status cuda_attention(const AttentionParams&) { return not_built(); }
Status cuda_quantize(const QuantizeParams&) { return not_built(); }
Status cuda_dequantize(const DequantizeParams&) { return not_built(); }
Status cuda_append(const AppendParams&) { return not_built(); }
size_t cuda_attention_workspace_size(const AttentionParams&) { return 0; }

}  // namespace qsdpa::detail
