// Emulated Ascend NPU: the parts that make it as strict as a real device.
//
//   * same-device checks: an op whose operands sit on npu and cpu (or on two
//     npu devices) fails as it does on CUDA and on torch_npu, instead of the
//     CPU fallback quietly copying everything to the host;
//   * streams and events, strict: what a side stream writes (kernels and
//     non_blocking copies) reads as poison on other streams until they wait;
//   * one random generator per device, used by every random op on it;
//   * a counter of device-to-host synchronisations (.item(), D2H copies).
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/core/Stream.h>

#include <cstdint>
#include <initializer_list>
#include <optional>

namespace vtools_npu {

constexpr c10::DeviceType kNpuType = c10::DeviceType::PrivateUse1;

// --- same device -------------------------------------------------------------
// Operands of one op: every npu tensor on one device; cpu tensors only as 0-dim
// scalars, or as integer/bool indices of advanced indexing (as CUDA allows).
void check_same_device(const c10::OperatorHandle& op, const torch::jit::Stack& stack);
void check_same_device(const char* op_name, std::initializer_list<const at::Tensor*> tensors);

// --- streams -----------------------------------------------------------------
c10::Stream current_stream(c10::DeviceIndex index);
c10::Stream exchange_stream(c10::Stream stream);
c10::Stream new_stream(c10::Device device);
// Strict streams: work issued while a side stream is current (kernels, non_blocking
// copies) is invisible to the other streams until they wait for that stream: its
// bytes read as poison (all bits set: NaN, -1, 255) for them. Create one
// StreamWork around each op: it shows the side stream its own earlier writes for
// the op, then hides them again together with what the op wrote (``wrote``).
// On the default stream it does nothing.
class StreamWork {
 public:
  explicit StreamWork(c10::DeviceIndex index);
  ~StreamWork();
  void wrote(const at::Tensor& t);
  void completed();  // a blocking op: the host waited for the stream, so all of it is visible
  StreamWork(const StreamWork&) = delete;
  StreamWork& operator=(const StreamWork&) = delete;

 private:
  std::optional<c10::Stream> side_;
  bool completed_ = false;
};
void flush_stream(c10::Stream stream);  // a wait: the stream's writes become visible for good
void flush_device(c10::DeviceIndex index);
void record_event(void** event, const c10::Stream& stream);
void block_on_event(void* event, const c10::Stream& stream);
void destroy_event(void* event);
int64_t hidden_storages();
int64_t recorded_streams();
void note_record_stream();

// --- randomness --------------------------------------------------------------
const at::Generator& device_generator(c10::DeviceIndex index);
bool is_random_op(const c10::OperatorHandle& op);
// Runs a CPU kernel with the device's generator standing in for the CPU default one.
class DeviceRngScope {
 public:
  explicit DeviceRngScope(c10::DeviceIndex index);
  ~DeviceRngScope();
  DeviceRngScope(const DeviceRngScope&) = delete;
  DeviceRngScope& operator=(const DeviceRngScope&) = delete;

 private:
  c10::DeviceIndex index_;
  at::Tensor saved_cpu_state_;
};

// --- host synchronisations ---------------------------------------------------
// Counts .item() and device-to-host copies made by user code; the copies the CPU
// fallback makes to run a kernel happen inside an InternalCopies scope and do not count.
void count_sync();
int64_t sync_count();
class InternalCopies {
 public:
  InternalCopies();
  ~InternalCopies();
  static bool active();
  InternalCopies(const InternalCopies&) = delete;
  InternalCopies& operator=(const InternalCopies&) = delete;

 private:
  bool previous_;
};

// --- the backend's own pieces others build on (npu_backend.cpp) -----------------
// A CPU tensor over the same bytes (npu memory is host memory).
at::Tensor host_alias(const at::Tensor& t);
// The boxed CPU fallback every op without its own npu kernel runs through.
void npu_cpu_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack);

// --- floating-point overflow (npu_overflow.cpp) --------------------------------
// A chip without Inf/NaN mode (an Atlas training 910A) saturates: a result that would be +-inf becomes the
// dtype's largest finite value, NaN becomes 0, and the device's float-status flag records it. With
// ``records_flag`` (FORCE_OVERFLOW_CHECK on a recent CANN) an Inf/NaN chip keeps the flag too, its
// results staying IEEE. Set once at start-up from the emulated chip.
void set_overflow_mode(bool saturates, bool records_flag);
bool saturates();
bool overflow_flag(c10::DeviceIndex index);
// Every result an op writes passes here: in flag mode a non-finite one raises its device's flag, and a
// saturating chip clamps it in place.
void note_result(const at::Tensor& t);

}  // namespace vtools_npu
