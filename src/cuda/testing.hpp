// Test hooks of the CUDA backend (not part of the public API): the GPU tests hold the generic
// kernel to the SPEC also on the problems that the tensor-core kernel takes in normal use.
#pragma once

#include "qsdpa/qsdpa.hpp"

namespace qsdpa::cuda {

// attention() on Backend::cuda (arguments already checked) with the generic kernel, even where
// the tensor-core kernel applies. Uses the library's workspace when p.workspace is null.
Status attention_generic_kernel(const AttentionParams& p);

// Whether attention() on Backend::cuda would run the tensor-core kernel for p (tests check that
// the layouts they mean for it reach it).
bool uses_tensor_cores(const AttentionParams& p);

}  // namespace qsdpa::cuda
