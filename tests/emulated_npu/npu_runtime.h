// Emulated Ascend NPU: the parts that make it as strict as a real device.
//
//   * same-device checks: an op whose operands sit on npu and cpu (or on two
//     npu devices) fails as it does on CUDA and on torch_npu, instead of the
//     CPU fallback quietly copying everything to the host;
//   * streams and events with a strict copy mode: a non_blocking host-to-device
//     copy issued on a side stream is poisoned until the consuming stream waits
//     for that stream (or the side stream itself runs a kernel);
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
// A host-to-device copy into ``dst`` (through its host alias): done now, or (strict
// mode, side stream, non_blocking) poisoned and deferred until the stream is waited for.
void copy_host_to_device(const at::Tensor& dst, const at::Tensor& dst_host_alias, const at::Tensor& src,
                         bool non_blocking);
void flush_stream(c10::Stream stream);   // completes the stream's deferred copies
void flush_current(c10::DeviceIndex index);  // before a kernel runs on the current stream
void flush_device(c10::DeviceIndex index);
void record_event(void** event, const c10::Stream& stream);
void block_on_event(void* event, const c10::Stream& stream);
void destroy_event(void* event);
int64_t pending_copies();
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

}  // namespace vtools_npu
