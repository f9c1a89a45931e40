// Emulated Ascend NPU: floating-point overflow as each chip handles it (see npu_runtime.h).
//
// An Atlas A2/A3 chip (910B) runs in Inf/NaN mode, IEEE 754 as on a GPU. An Atlas training chip (910A) has no
// such mode: it saturates. A result that would be +-inf becomes the dtype's largest finite value, NaN becomes
// 0 (CANN's aclrtFloatOverflowMode and INF_NAN_MODE_ENABLE pages: float16 exp(12) reads 65504), and the only
// trace of the overflow is the chip's float-status flag, which stays raised until it is cleared.
//
// What torch_npu 2.14.0 offers around that flag, emulated here with the wheel's schemas (its library's strings,
// checked in tests/runtime/test_device_kinds_wheel.py):
//   npu::npu_alloc_float_status(Tensor input) -> Tensor          eight zeros
//   npu::npu_get_float_status(Tensor input, int mode=0) -> Tensor   element 0 nonzero while the flag is raised
//   npu::npu_clear_float_status(Tensor input, int mode=0) -> Tensor lowers the flag
//   npu::_amp_foreach_non_finite_check(Tensor[] scaled_grads) -> bool   reads the flag, lowers it when raised
// and the kernel of aten::_amp_foreach_non_finite_check_and_unscale_ that GradScaler calls: in Inf/NaN mode it
// looks at the gradients' values; on a saturating chip it asks the flag instead (the op-plugin kernel's
// "saturation mode" branch): a raised flag sets found_inf, is lowered, and leaves the gradients scaled.
// The `mode` argument of the status operators selects what the real kernel reads; here there is one flag.

#include "npu_runtime.h"

#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include <array>
#include <atomic>

namespace vtools_npu {

namespace {

constexpr int kFlagDevices = 64;
constexpr int64_t kStatusSize = 8;  // FLOAT_STATUS_OP_DIMS_SIZE in torch_npu's kernels

std::atomic<bool> g_saturates{false};
std::atomic<bool> g_records_flag{false};
std::array<std::atomic<bool>, kFlagDevices> g_flag{};

std::atomic<bool>& flag_of(c10::DeviceIndex index) {
  TORCH_INTERNAL_ASSERT(index >= 0 && index < kFlagDevices);  // device indices are checked before any op runs
  return g_flag[static_cast<size_t>(index)];
}

at::Tensor status_tensor(const at::Tensor& like, bool raised) {
  auto status = at::zeros({kStatusSize}, like.options().dtype(at::kFloat));
  if (raised) {
    host_alias(status).select(0, 0).fill_(1.0);
  }
  return status;
}

at::Tensor alloc_float_status(const at::Tensor& input) {
  return status_tensor(input, false);
}

at::Tensor get_float_status(const at::Tensor& input, int64_t /*mode*/) {
  return status_tensor(input, flag_of(input.device().index()).load());
}

at::Tensor clear_float_status(const at::Tensor& input, int64_t /*mode*/) {
  flag_of(input.device().index()).store(false);
  return status_tensor(input, false);
}

bool non_finite_check(at::TensorList scaled_grads) {
  return !scaled_grads.empty() && flag_of(scaled_grads[0].device().index()).exchange(false);
}

// GradScaler's check: in saturation mode the flag decides (the gradients hold no inf to find).
void check_and_unscale(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  if (!g_saturates.load()) {
    npu_cpu_fallback(op, stack);
    return;
  }
  auto arguments = torch::jit::last(*stack, 3);
  const std::vector<at::Tensor> grads = arguments[0].toTensorVector();
  const at::Tensor found_inf = arguments[1].toTensor();
  const at::Tensor inv_scale = arguments[2].toTensor();
  torch::jit::drop(*stack, 3);
  TORCH_CHECK(inv_scale.numel() == 1, "inv_scale must be a 1-element tensor");
  TORCH_CHECK(found_inf.numel() == 1, "found_inf must be a 1-element tensor");
  if (grads.empty()) {
    return;
  }
  std::vector<const at::Tensor*> operands{&found_inf, &inv_scale};
  for (const at::Tensor& grad : grads) {
    operands.push_back(&grad);
  }
  for (const at::Tensor* operand : operands) {
    check_same_device("aten::_amp_foreach_non_finite_check_and_unscale_", {operands[0], operand});
  }
  if (non_finite_check(grads)) {
    host_alias(found_inf).fill_(1.0);
    return;
  }
  const at::Tensor inverse = host_alias(inv_scale);
  for (const at::Tensor& grad : grads) {
    host_alias(grad).mul_(inverse);
  }
}

}  // namespace

void set_overflow_mode(bool saturates, bool records_flag) {
  g_saturates.store(saturates);
  g_records_flag.store(saturates || records_flag);
}

bool saturates() {
  return g_saturates.load();
}

bool overflow_flag(c10::DeviceIndex index) {
  return flag_of(index).load();
}

void note_result(const at::Tensor& t) {
  if (!g_records_flag.load(std::memory_order_relaxed) || !t.defined() || t.device().type() != kNpuType ||
      !at::isFloatingType(t.scalar_type()) || t.numel() == 0) {
    return;
  }
  at::Tensor values = host_alias(t);
  if (values.isfinite().all().item<bool>()) {
    return;
  }
  flag_of(t.device().index()).store(true);
  if (g_saturates.load()) {
    values.nan_to_num_(0.0);  // +-inf -> the dtype's largest finite value, NaN -> 0
  }
}

TORCH_LIBRARY(npu, m) {
  m.def("npu_alloc_float_status(Tensor input) -> Tensor");
  m.def("npu_get_float_status(Tensor input, int mode=0) -> Tensor");
  m.def("npu_clear_float_status(Tensor input, int mode=0) -> Tensor");
  m.def("_amp_foreach_non_finite_check(Tensor[] scaled_grads) -> bool");
}

TORCH_LIBRARY_IMPL(npu, PrivateUse1, m) {
  m.impl("npu_alloc_float_status", TORCH_FN(alloc_float_status));
  m.impl("npu_get_float_status", TORCH_FN(get_float_status));
  m.impl("npu_clear_float_status", TORCH_FN(clear_float_status));
  m.impl("_amp_foreach_non_finite_check", TORCH_FN(non_finite_check));
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_amp_foreach_non_finite_check_and_unscale_",
         torch::CppFunction::makeFromBoxedFunction<&check_and_unscale>());
}

}  // namespace vtools_npu
