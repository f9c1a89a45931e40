// Emulated Ascend NPU: same-device checks, streams with strict copies, per-device
// generators and the host-sync counter (see npu_runtime.h).

#include "npu_runtime.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/GeneratorForPrivateuseone.h>
#include <ATen/ops/from_blob.h>
#include <ATen/core/jit_type.h>
#include <c10/util/Exception.h>

#include <array>
#include <atomic>
#include <cstdlib>
#include <limits>
#include <map>
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
// Streams, events and strict side streams
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

// Storages a side stream wrote that no one has waited for yet. While hidden, the
// device bytes hold poison and ``real`` holds the side stream's view of them.
struct Hidden {
  c10::Stream stream;
  c10::Storage storage;  // keeps the memory alive until the wait
  at::Tensor bytes;      // host alias of the whole storage
  at::Tensor real;
};

std::mutex g_hidden_mutex;
std::map<const void*, Hidden> g_hidden;
std::atomic<int64_t> g_hidden_count{0};

constexpr int64_t kPoison = 0xFF;  // all bits set: NaN for every float width, -1 for signed integers

void reveal_locked(const c10::Stream& stream) {
  for (auto& entry : g_hidden) {
    Hidden& hidden = entry.second;
    if (hidden.stream == stream && hidden.real.defined()) {
      hidden.bytes.copy_(hidden.real);
    }
  }
}

void hide_locked(const c10::Stream& stream) {
  for (auto& entry : g_hidden) {
    Hidden& hidden = entry.second;
    if (hidden.stream == stream) {
      hidden.real = hidden.bytes.clone();
      hidden.bytes.fill_(kPoison);
    }
  }
}

template <typename Predicate>
void flush_where(Predicate matches) {
  if (g_hidden_count.load() == 0) {
    return;
  }
  std::lock_guard<std::mutex> lock(g_hidden_mutex);
  for (auto it = g_hidden.begin(); it != g_hidden.end();) {
    if (matches(it->second.stream)) {
      if (it->second.real.defined()) {
        it->second.bytes.copy_(it->second.real);
      }
      it = g_hidden.erase(it);
    } else {
      ++it;
    }
  }
  g_hidden_count.store(static_cast<int64_t>(g_hidden.size()));
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

StreamWork::StreamWork(c10::DeviceIndex index) {
  if (!strict_streams() || InternalCopies::active()) {
    return;  // the op that makes these copies is already inside a StreamWork
  }
  const c10::Stream stream = current_stream(index);
  if (stream.id() == 0) {
    return;
  }
  side_ = stream;
  std::lock_guard<std::mutex> lock(g_hidden_mutex);
  reveal_locked(*side_);
}

void StreamWork::wrote(const at::Tensor& t) {
  if (!side_ || !t.defined() || t.device().type() != kNpuType || !t.has_storage()) {
    return;
  }
  const c10::Storage& storage = t.storage();
  void* data = storage.mutable_data();
  if (data == nullptr || storage.nbytes() == 0) {
    return;
  }
  std::lock_guard<std::mutex> lock(g_hidden_mutex);
  if (g_hidden.count(data) == 0) {
    auto bytes = at::from_blob(data, {static_cast<int64_t>(storage.nbytes())},
                               at::TensorOptions().dtype(at::kByte).device(c10::DeviceType::CPU));
    g_hidden.emplace(data, Hidden{*side_, storage, bytes, at::Tensor()});
    g_hidden_count.store(static_cast<int64_t>(g_hidden.size()));
  }
}

void StreamWork::completed() {
  completed_ = true;
}

StreamWork::~StreamWork() {
  if (!side_) {
    return;
  }
  if (completed_) {
    flush_stream(*side_);
    return;
  }
  std::lock_guard<std::mutex> lock(g_hidden_mutex);
  hide_locked(*side_);
}

void flush_stream(c10::Stream stream) {
  flush_where([&](const c10::Stream& s) { return s == stream; });
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
  // Everything the recorded stream issued is visible once anyone waits for it.
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

int64_t hidden_storages() {
  return g_hidden_count.load();
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
