// Emulated Ascend NPU: same-device checks, streams with strict copies, per-device
// generators and the host-sync counter (see npu_runtime.h).

#include "npu_runtime.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/GeneratorForPrivateuseone.h>
#include <ATen/core/jit_type.h>
#include <c10/util/Exception.h>

#include <array>
#include <atomic>
#include <cstdlib>
#include <limits>
#include <mutex>
#include <sstream>
#include <string>
#include <unordered_set>
#include <vector>

namespace vtools_npu {

constexpr int kMaxStreamDevices = 64;

// ---------------------------------------------------------------------------
// Same device
// ---------------------------------------------------------------------------

namespace {

bool allows_cpu_indices(const std::string& name) {
  static const std::unordered_set<std::string> ops = {
      "aten::index", "aten::index_put", "aten::index_put_", "aten::_index_put_impl_",
      "aten::_unsafe_index", "aten::_unsafe_index_put"};
  return ops.count(name) > 0;
}

class DeviceChecker {
 public:
  DeviceChecker(std::string op_name, bool cpu_indices_ok)
      : op_name_(std::move(op_name)), cpu_indices_ok_(cpu_indices_ok) {}

  void add(const at::Tensor& t) {
    if (!t.defined()) {
      return;
    }
    const auto device = t.device();
    if (device.type() == kNpuType) {
      if (npu_ && *npu_ != device) {
        fail(*npu_, device);
      }
      npu_ = device;
    } else if (device.is_cpu()) {
      const bool scalar = t.dim() == 0;
      const bool index = cpu_indices_ok_ && (at::isIntegralType(t.scalar_type(), /*includeBool=*/true));
      if (!scalar && !index) {
        cpu_ = true;
      }
    }
  }

  void add(const c10::IValue& value) {
    if (value.isTensor()) {
      add(value.toTensor());
    } else if (value.isTensorList()) {
      for (const at::Tensor& t : value.toTensorVector()) {
        add(t);
      }
    } else if (value.isList()) {
      for (const c10::IValue& item : value.toListRef()) {
        if (item.isTensor()) {
          add(item.toTensor());
        }
      }
    }
  }

  void finish() const {
    if (npu_ && cpu_) {
      fail(*npu_, c10::Device(c10::DeviceType::CPU));
    }
  }

 private:
  [[noreturn]] void fail(c10::Device a, c10::Device b) const {
    TORCH_CHECK(false, "Expected all tensors to be on the same device, but found at least two devices, ", a,
                " and ", b, "! (", op_name_, " on the emulated npu)");
  }

  std::string op_name_;
  bool cpu_indices_ok_;
  std::optional<c10::Device> npu_;
  bool cpu_ = false;
};

}  // namespace

void check_same_device(const c10::OperatorHandle& op, const torch::jit::Stack& stack) {
  const auto& name = op.schema().name();
  DeviceChecker checker(name, allows_cpu_indices(name));
  const size_t count = op.schema().arguments().size();
  for (const c10::IValue& value : torch::jit::last(stack, count)) {
    checker.add(value);
  }
  checker.finish();
}

void check_same_device(const char* op_name, std::initializer_list<const at::Tensor*> tensors) {
  DeviceChecker checker(op_name, false);
  for (const at::Tensor* t : tensors) {
    if (t != nullptr) {
      checker.add(*t);
    }
  }
  checker.finish();
}

// ---------------------------------------------------------------------------
// Streams, events and strict copies
// ---------------------------------------------------------------------------

namespace {

// Like CUDA: the current stream is per thread and per device; id 0 is the default stream.
thread_local std::array<c10::StreamId, kMaxStreamDevices> t_current_stream{};
std::atomic<c10::StreamId> g_next_stream{1};
std::atomic<int64_t> g_recorded_streams{0};

bool strict_streams() {
  static const bool strict = [] {
    const char* value = std::getenv("VTOOLS_EMU_NPU_STRICT_STREAMS");
    return value == nullptr || std::string(value) != "0";
  }();
  return strict;
}

struct PendingCopy {
  c10::Stream stream;
  at::Tensor keep_alive;  // the npu destination: its storage must outlive the copy
  at::Tensor dst;         // host alias of the destination
  at::Tensor src;         // a private copy of the source, taken when the copy was issued
};

std::mutex g_pending_mutex;
std::vector<PendingCopy> g_pending;
std::atomic<int64_t> g_pending_count{0};

// What a reader sees before the copy lands: NaN, or all bits set (-1 for signed
// integers, so a class index is out of range; 255 for uint8 pixels).
void poison(const at::Tensor& t) {
  if (at::isFloatingType(t.scalar_type()) || at::isComplexType(t.scalar_type())) {
    t.fill_(std::numeric_limits<double>::quiet_NaN());
  } else if (t.scalar_type() == at::kBool) {
    t.fill_(true);
  } else if (t.scalar_type() == at::kByte) {
    t.fill_(255);
  } else {
    t.fill_(-1);
  }
}

template <typename Predicate>
void flush_where(Predicate matches) {
  if (g_pending_count.load() == 0) {
    return;
  }
  std::vector<PendingCopy> ready;
  {
    std::lock_guard<std::mutex> lock(g_pending_mutex);
    auto keep = g_pending.begin();
    for (auto& copy : g_pending) {
      if (matches(copy.stream)) {
        ready.push_back(std::move(copy));
      } else {
        *keep++ = std::move(copy);
      }
    }
    g_pending.erase(keep, g_pending.end());
    g_pending_count.store(static_cast<int64_t>(g_pending.size()));
  }
  for (auto& copy : ready) {
    copy.dst.copy_(copy.src);
  }
}

struct EmulatedEvent {
  std::optional<c10::Stream> stream;
};

}  // namespace

c10::Stream current_stream(c10::DeviceIndex index) {
  return c10::Stream(c10::Stream::UNSAFE, c10::Device(kNpuType, index), t_current_stream.at(index));
}

c10::Stream exchange_stream(c10::Stream stream) {
  const auto index = stream.device_index();
  const c10::Stream old = current_stream(index);
  t_current_stream.at(index) = stream.id();
  return old;
}

c10::Stream new_stream(c10::Device device) {
  return c10::Stream(c10::Stream::UNSAFE, device, g_next_stream.fetch_add(1));
}

void copy_host_to_device(const at::Tensor& dst, const at::Tensor& dst_host_alias, const at::Tensor& src,
                         bool non_blocking) {
  const c10::Stream stream = current_stream(dst.device().index());
  if (!strict_streams() || !non_blocking || stream.id() == 0) {
    dst_host_alias.copy_(src);
    return;
  }
  PendingCopy copy{stream, dst, dst_host_alias, src.clone()};
  poison(dst_host_alias);
  std::lock_guard<std::mutex> lock(g_pending_mutex);
  g_pending.push_back(std::move(copy));
  g_pending_count.store(static_cast<int64_t>(g_pending.size()));
}

void flush_stream(c10::Stream stream) {
  flush_where([&](const c10::Stream& s) { return s == stream; });
}

void flush_current(c10::DeviceIndex index) {
  if (g_pending_count.load() == 0) {
    return;
  }
  flush_stream(current_stream(index));
}

void flush_device(c10::DeviceIndex index) {
  flush_where([&](const c10::Stream& s) { return s.device_index() == index; });
}

void record_event(void** event, const c10::Stream& stream) {
  if (*event == nullptr) {
    *event = new EmulatedEvent();
  }
  static_cast<EmulatedEvent*>(*event)->stream = stream;
}

void block_on_event(void* event, const c10::Stream& /*waiting_stream*/) {
  // Everything the recorded stream issued is done once anyone waits for it.
  if (event == nullptr) {
    return;
  }
  auto* emulated = static_cast<EmulatedEvent*>(event);
  if (emulated->stream) {
    flush_stream(*emulated->stream);
  }
}

void destroy_event(void* event) {
  delete static_cast<EmulatedEvent*>(event);
}

int64_t pending_copies() {
  return g_pending_count.load();
}

int64_t recorded_streams() {
  return g_recorded_streams.load();
}

void note_record_stream() {
  g_recorded_streams.fetch_add(1);
}

// ---------------------------------------------------------------------------
// One generator per device
// ---------------------------------------------------------------------------

namespace {

std::mutex g_generator_mutex;
std::array<std::optional<at::Generator>, kMaxStreamDevices> g_generators;

}  // namespace

const at::Generator& device_generator(c10::DeviceIndex index) {
  std::lock_guard<std::mutex> lock(g_generator_mutex);
  auto& slot = g_generators.at(index);
  if (!slot) {
    slot = at::make_generator<at::CPUGeneratorImpl>(c10::default_rng_seed_val);
  }
  return *slot;
}

bool is_random_op(const c10::OperatorHandle& op) {
  static const std::unordered_set<std::string> without_generator_argument = {
      "aten::native_dropout", "aten::rrelu_with_noise", "aten::rrelu_with_noise_"};
  const auto& schema = op.schema();
  if (without_generator_argument.count(schema.name()) > 0) {
    return true;
  }
  for (const auto& argument : schema.arguments()) {
    const auto& type = argument.type();
    if (type->kind() == c10::TypeKind::GeneratorType) {
      return true;
    }
    if (auto optional = type->cast<c10::OptionalType>()) {
      if (optional->getElementType()->kind() == c10::TypeKind::GeneratorType) {
        return true;
      }
    }
  }
  return false;
}

DeviceRngScope::DeviceRngScope(c10::DeviceIndex index) : index_(index) {
  auto cpu = at::detail::getDefaultCPUGenerator();
  at::Generator device = device_generator(index);
  std::lock_guard<std::mutex> cpu_lock(cpu.mutex());
  std::lock_guard<std::mutex> device_lock(device.mutex());
  saved_cpu_state_ = cpu.get_state();
  cpu.set_state(device.get_state());
}

DeviceRngScope::~DeviceRngScope() {
  auto cpu = at::detail::getDefaultCPUGenerator();
  at::Generator device = device_generator(index_);
  std::lock_guard<std::mutex> cpu_lock(cpu.mutex());
  std::lock_guard<std::mutex> device_lock(device.mutex());
  device.set_state(cpu.get_state());
  cpu.set_state(saved_cpu_state_);
}

// ---------------------------------------------------------------------------
// Host synchronisations
// ---------------------------------------------------------------------------

namespace {
std::atomic<int64_t> g_syncs{0};
thread_local bool t_internal_copies = false;
}  // namespace

InternalCopies::InternalCopies() : previous_(t_internal_copies) {
  t_internal_copies = true;
}

InternalCopies::~InternalCopies() {
  t_internal_copies = previous_;
}

bool InternalCopies::active() {
  return t_internal_copies;
}

void count_sync() {
  if (!t_internal_copies) {
    g_syncs.fetch_add(1);
  }
}

int64_t sync_count() {
  return g_syncs.load();
}

}  // namespace vtools_npu
