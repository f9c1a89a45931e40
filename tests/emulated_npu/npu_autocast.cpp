// Autocast for the emulated NPU (dispatch key AutocastPrivateUse1).
//
// PyTorch 2.14 registers autocast kernels for CPU, CUDA, XPU, MPS, MTIA and
// MAIA but nothing for AutocastPrivateUse1 - not even a fallthrough - so a
// backend must do both itself. autocast_mode.h exports the op lists
// (AT_FORALL_*) so that backends apply the same policies as CUDA:
//   lower_precision_fp  matmul / conv / linear / bmm ... run in fp16 or bf16
//   fp32                exp, log, norms, losses ... run in float32
//   fp32_set_opt_dtype  softmax, log_softmax, sum, cumsum ... accumulate in fp32
//   promote             mixed-dtype ops run in the widest input dtype
// The low-precision dtype is whatever torch.autocast("npu", dtype=...) set.
// Kept in its own file because autocast_mode.h pulls in every native function
// declaration: ninja compiles it in parallel with npu_backend.cpp.

#include <ATen/autocast_mode.h>
#include <torch/library.h>

// Inside namespace at: the op lists name Tensor, Scalar, ... unqualified.
namespace at {
namespace {

TORCH_LIBRARY_IMPL(aten, AutocastPrivateUse1, m) {
#define VTOOLS_NPU_LOWER(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, lower_precision_fp)
#define VTOOLS_NPU_FP32(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32)
#define VTOOLS_NPU_FP32_OPT_DTYPE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32_set_opt_dtype)
#define VTOOLS_NPU_PROMOTE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, promote)
  AT_FORALL_LOWER_PRECISION_FP(VTOOLS_NPU_LOWER)
  AT_FORALL_FP32(VTOOLS_NPU_FP32)
  AT_FORALL_FP32_SET_OPT_DTYPE(VTOOLS_NPU_FP32_OPT_DTYPE)
  AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE(KERNEL_DIFFERENT_REDISPATCH_SIGNATURE_PRIVATEUSEONE)
  AT_FORALL_PROMOTE(VTOOLS_NPU_PROMOTE)
#undef VTOOLS_NPU_LOWER
#undef VTOOLS_NPU_FP32
#undef VTOOLS_NPU_FP32_OPT_DTYPE
#undef VTOOLS_NPU_PROMOTE
}

}  // namespace
}  // namespace at

namespace vtools_npu {

// Ops without an explicit policy must pass through the autocast key
// untouched. Registered at import, and only if PyTorch has not done it itself
// (a second fallback for the same key would be a hard error).
void register_autocast_fallthrough() {
  static bool done = false;
  if (done) {
    return;
  }
  done = true;
  if (c10::Dispatcher::singleton().hasBackendFallbackForDispatchKey(
          c10::DispatchKey::AutocastPrivateUse1)) {
    return;
  }
  // Never destroyed: the registration must live as long as the process.
  auto* lib = new torch::Library(
      torch::Library::IMPL, "_", c10::DispatchKey::AutocastPrivateUse1, __FILE__, __LINE__);
  lib->fallback(torch::CppFunction::makeFallthrough());
}

}  // namespace vtools_npu
