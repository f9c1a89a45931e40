// Emulated Ascend NPU: a PrivateUse1 backend whose tensors live in host memory.
//
// Written for vtools' CI from PyTorch's PrivateUse1 documentation. It gives the
// "npu" device the pieces that PyTorch's generic code asks a real backend for:
//   * an allocator (malloc based, with per-device byte counters),
//   * a device guard (current device per thread, device count from the env),
//   * PrivateUse1 hooks (torch.accelerator, pinned memory, generators),
//   * native kernels for the ops that create, alias or copy storage,
//   * a boxed CPU fallback for every other op (plus the few ops that cannot
//     use it as is: convolution_overrideable, native_batch_norm),
//   * what makes it as strict as a real device (npu_runtime.cpp): same-device
//     checks, streams with strict copies, per-device generators, a sync counter.
// Autocast registrations live in npu_autocast.cpp (a second translation unit
// so that ninja compiles the two heavy halves in parallel).

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/EmptyTensor.h>
#include <ATen/core/Tensor.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <ATen/native/CPUFallback.h>
#include <ATen/ops/_local_scalar_dense.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/convolution.h>
#include <ATen/ops/convolution_backward.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/native_batch_norm.h>
#include <ATen/ops/resize_native.h>
#include <ATen/ops/set_native.h>
#include <ATen/ops/unfold_native.h>
#include <ATen/ops/view_as_complex_native.h>
#include <ATen/ops/view_as_real_native.h>
#include <ATen/ops/view_native.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/library.h>

#include <pybind11/pybind11.h>
#include <torch/csrc/utils/pybind.h>  // at::Tensor <-> torch.Tensor in the bindings

#include "npu_runtime.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>

namespace vtools_npu {

void register_autocast_fallthrough();  // npu_autocast.cpp

using c10::Device;
using c10::DeviceIndex;
using c10::DeviceType;

constexpr DeviceType kNpu = DeviceType::PrivateUse1;
constexpr int kMaxDevices = 64;
// Per-device memory (an Ascend 910B has 64 GB of HBM). Allocations are plain
// host mallocs; one that would take a device past it fails as torch_npu's
// caching allocator fails, before any host memory is asked for.
constexpr int64_t kTotalMemory = int64_t(64) << 30;

// ---------------------------------------------------------------------------
// Device count and current device
// ---------------------------------------------------------------------------

// ASCEND_RT_VISIBLE_DEVICES wins, like on a real Ascend host, read as torch_npu reads it
// (_parse_visible_devices, _device_count_ascend_hal): the ids up to the first character that is neither a digit
// nor a comma and up to the first empty entry ("0, 1" is one device), none unless ascending. Otherwise
// VTOOLS_EMU_NPU_DEVICE_COUNT (default 2). Read once: real runtimes also fix the visible devices at
// initialisation.
static DeviceIndex read_device_count() {
  if (const char* visible = std::getenv("ASCEND_RT_VISIBLE_DEVICES")) {
    std::string text(visible);
    const size_t end = text.find_first_not_of("0123456789,");
    text = text.substr(0, end);
    int n = 0;
    long previous = -1;
    size_t start = 0;
    while (start <= text.size()) {
      const size_t comma = std::min(text.find(',', start), text.size());
      if (comma == start) {
        break;  // an empty entry ends the list
      }
      const long id = std::strtol(text.substr(start, comma - start).c_str(), nullptr, 10);
      if (id <= previous) {
        return 0;  // the runtime needs ascending ids
      }
      previous = id;
      ++n;
      start = comma + 1;
    }
    return static_cast<DeviceIndex>(std::min(n, kMaxDevices));
  }
  long n = 2;
  if (const char* count = std::getenv("VTOOLS_EMU_NPU_DEVICE_COUNT")) {
    char* end = nullptr;
    long parsed = std::strtol(count, &end, 10);
    // The Python side validates the variable; here we only stay in range.
    if (end != count) {
      n = parsed;
    }
  }
  return static_cast<DeviceIndex>(std::max(0L, std::min<long>(n, kMaxDevices)));
}

DeviceIndex device_count() {
  static const DeviceIndex count = read_device_count();
  return count;
}

// Like CUDA: the current device is per thread and starts at 0.
thread_local DeviceIndex t_current_device = 0;

void check_device_index(DeviceIndex index) {
  TORCH_CHECK(
      index >= 0 && index < device_count(),
      "npu: invalid device ordinal ", static_cast<int>(index),
      " (the emulator has ", static_cast<int>(device_count()), " device(s))");
}

// ---------------------------------------------------------------------------
// Device allocator: malloc/free plus byte counters per device
// ---------------------------------------------------------------------------

// 64-byte aligned host memory, like PyTorch's CPU allocator, so the CPU
// kernels that the fallback runs on device memory see what they expect.
void* aligned_host_alloc(size_t nbytes, const char* what) {
  void* ptr = nullptr;
  if (posix_memalign(&ptr, 64, nbytes) != 0) {
    ptr = nullptr;
  }
  TORCH_CHECK_WITH(
      OutOfMemoryError, ptr != nullptr,
      "npu: out of host memory ", what, " ", nbytes, " bytes");
  return ptr;
}

void free_device_ptr(void* ptr);

// c10's way of printing a size in the allocator's messages: "2.00 GiB", "512.00 KiB", "12 bytes".
std::string format_size(int64_t size) {
  char buffer[64];
  if (size < 1024) {
    std::snprintf(buffer, sizeof(buffer), "%lld bytes", static_cast<long long>(size));
  } else if (size < 1048576) {
    std::snprintf(buffer, sizeof(buffer), "%.2f KiB", size / 1024.0);
  } else if (size < 1073741824) {
    std::snprintf(buffer, sizeof(buffer), "%.2f MiB", size / 1048576.0);
  } else {
    std::snprintf(buffer, sizeof(buffer), "%.2f GiB", size / 1073741824.0);
  }
  return buffer;
}

class NpuAllocator final : public c10::DeviceAllocator {
 public:
  c10::DataPtr allocate(size_t nbytes) override {
    const DeviceIndex index = t_current_device;
    check_device_index(index);
    void* ptr = nullptr;
    if (nbytes > 0) {
      check_capacity(index, nbytes);
      ptr = aligned_host_alloc(nbytes, "allocating");
      std::lock_guard<std::mutex> lock(mutex_);
      blocks_[reinterpret_cast<uintptr_t>(ptr)] = Block{nbytes, index};
      stats_[index].bytes.increase(nbytes);
      stats_[index].count.increase(1);
    }
    return {ptr, ptr, &free_device_ptr, Device(kNpu, index)};
  }

  // torch_npu's words (NPUCachingAllocator; tests/runtime/test_device_kinds_wheel.py finds each piece in the
  // real library): nothing is cached here, so allocated, active and reserved are the same number.
  void check_capacity(DeviceIndex index, size_t nbytes) {
    int64_t used = 0;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      used = stats_[index].bytes.current;
    }
    const int64_t wanted = static_cast<int64_t>(nbytes);
    if (wanted <= kTotalMemory - used) {
      return;
    }
    const std::string held = format_size(used);
    TORCH_CHECK_WITH(
        OutOfMemoryError, false, "NPU out of memory. Tried to allocate ", format_size(wanted), " (NPU ",
        static_cast<int>(index), "; ", format_size(kTotalMemory), " total capacity; ", held,
        " already allocated; ", held, " current active; ", format_size(kTotalMemory - used), " free; ", held,
        " reserved in total by PyTorch)");
  }

  void release(void* ptr) {
    if (ptr == nullptr) {
      return;
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = blocks_.find(reinterpret_cast<uintptr_t>(ptr));
      TORCH_INTERNAL_ASSERT(it != blocks_.end(), "npu: freeing unknown pointer");
      stats_[it->second.device].bytes.decrease(it->second.size);
      stats_[it->second.device].count.decrease(1);
      blocks_.erase(it);
    }
    std::free(ptr);
  }

  c10::DeleterFnPtr raw_deleter() const override {
    return &free_device_ptr;
  }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);  // device memory is host memory
  }

  // Which device owns an address (also for addresses inside a block).
  std::optional<DeviceIndex> device_of(const void* ptr) {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto addr = reinterpret_cast<uintptr_t>(ptr);
    auto it = blocks_.upper_bound(addr);
    if (it == blocks_.begin()) {
      return std::nullopt;
    }
    --it;
    if (addr < it->first + it->second.size) {
      return it->second.device;
    }
    return std::nullopt;
  }

  int64_t allocated(DeviceIndex index) {
    check_device_index(index);
    std::lock_guard<std::mutex> lock(mutex_);
    return stats_[index].bytes.current;
  }

  int64_t peak(DeviceIndex index) {
    check_device_index(index);
    std::lock_guard<std::mutex> lock(mutex_);
    return stats_[index].bytes.peak;
  }

  // --- c10::DeviceAllocator: makes torch.accelerator.memory_* work too ---
  bool initialized() override {
    return true;
  }
  void emptyCache(c10::MempoolId_t /*unused*/) override {}  // nothing cached
  void recordStream(const c10::DataPtr& /*unused*/, c10::Stream /*unused*/) override {}

  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(DeviceIndex index) override {
    check_device_index(index);
    std::lock_guard<std::mutex> lock(mutex_);
    c10::CachingDeviceAllocator::DeviceStats out;
    const auto agg = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
    // No caching: allocated == reserved == active == requested.
    out.allocated_bytes[agg] = stats_[index].bytes;
    out.reserved_bytes[agg] = stats_[index].bytes;
    out.active_bytes[agg] = stats_[index].bytes;
    out.requested_bytes[agg] = stats_[index].bytes;
    out.allocation[agg] = stats_[index].count;
    out.active[agg] = stats_[index].count;
    out.segment[agg] = stats_[index].count;
    return out;
  }

  void resetAccumulatedStats(DeviceIndex index) override {
    check_device_index(index);
    std::lock_guard<std::mutex> lock(mutex_);
    stats_[index].bytes.reset_accumulated();
    stats_[index].count.reset_accumulated();
  }

  void resetPeakStats(DeviceIndex index) override {
    check_device_index(index);
    std::lock_guard<std::mutex> lock(mutex_);
    stats_[index].bytes.reset_peak();
    stats_[index].count.reset_peak();
  }

  std::pair<size_t, size_t> getMemoryInfo(DeviceIndex index) override {
    const int64_t used = allocated(index);
    return {static_cast<size_t>(std::max<int64_t>(0, kTotalMemory - used)),
            static_cast<size_t>(kTotalMemory)};
  }

 private:
  struct Block {
    size_t size;
    DeviceIndex device;
  };
  struct Stats {
    c10::CachingAllocator::Stat bytes;
    c10::CachingAllocator::Stat count;
  };
  std::mutex mutex_;
  std::map<uintptr_t, Block> blocks_;  // ordered, for device_of()
  Stats stats_[kMaxDevices];
};

NpuAllocator g_allocator;

void free_device_ptr(void* ptr) {
  g_allocator.release(ptr);
}

REGISTER_ALLOCATOR(kNpu, &g_allocator)

// ---------------------------------------------------------------------------
// Pinned host memory: ordinary malloc, but remembered so that isPinnedPtr()
// (tensor.is_pinned()) answers True. A real backend page-locks it.
// ---------------------------------------------------------------------------

void free_pinned_ptr(void* ptr);

class PinnedAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t nbytes) override {
    void* ptr = nullptr;
    if (nbytes > 0) {
      ptr = aligned_host_alloc(nbytes, "pinning");
      std::lock_guard<std::mutex> lock(mutex_);
      blocks_[reinterpret_cast<uintptr_t>(ptr)] = nbytes;
    }
    return {ptr, ptr, &free_pinned_ptr, Device(DeviceType::CPU)};
  }

  void release(void* ptr) {
    if (ptr == nullptr) {
      return;
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      blocks_.erase(reinterpret_cast<uintptr_t>(ptr));
    }
    std::free(ptr);
  }

  bool contains(const void* ptr) {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto addr = reinterpret_cast<uintptr_t>(ptr);
    auto it = blocks_.upper_bound(addr);
    if (it == blocks_.begin()) {
      return false;
    }
    --it;
    return addr < it->first + it->second;
  }

  c10::DeleterFnPtr raw_deleter() const override {
    return &free_pinned_ptr;
  }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }

 private:
  std::mutex mutex_;
  std::map<uintptr_t, size_t> blocks_;
};

PinnedAllocator g_pinned_allocator;

void free_pinned_ptr(void* ptr) {
  g_pinned_allocator.release(ptr);
}

// ---------------------------------------------------------------------------
// Device guard. Everything runs synchronously on the calling thread, so there
// is a single default stream per device and events are always complete.
// ---------------------------------------------------------------------------

struct NpuGuardImpl final : public c10::impl::DeviceGuardImplInterface {
  DeviceType type() const override {
    return kNpu;
  }

  Device exchangeDevice(Device device) const override {
    TORCH_INTERNAL_ASSERT(device.type() == kNpu);
    const Device old = getDevice();
    if (device.index() != old.index()) {
      setDevice(device);
    }
    return old;
  }

  Device getDevice() const override {
    return Device(kNpu, t_current_device);
  }

  void setDevice(Device device) const override {
    TORCH_INTERNAL_ASSERT(device.type() == kNpu);
    check_device_index(device.index());
    t_current_device = device.index();
  }

  void uncheckedSetDevice(Device device) const noexcept override {
    t_current_device = device.index();
  }

  c10::Stream getStream(Device device) const override {
    return current_stream(device.index());
  }

  c10::Stream getDefaultStream(Device device) const override {
    return c10::Stream(c10::Stream::DEFAULT, device);
  }

  c10::Stream getStreamFromGlobalPool(Device device, bool /*high_priority*/) const override {
    return new_stream(device);
  }

  c10::Stream getNewStream(Device device, int /*priority*/) const override {
    return new_stream(device);
  }

  c10::Stream exchangeStream(c10::Stream stream) const override {
    return exchange_stream(stream);
  }

  DeviceIndex deviceCount() const noexcept override {
    return device_count();
  }

  // Kernels finish before they return; what an event orders is the copies a
  // stream has deferred (strict mode): waiting for the event completes them.
  void record(void** event, const c10::Stream& stream, const DeviceIndex /*device_index*/,
              const c10::EventFlag /*flag*/) const override {
    record_event(event, stream);
  }
  void block(void* event, const c10::Stream& stream) const override {
    block_on_event(event, stream);
  }
  bool queryEvent(void* /*event*/) const override {
    return true;
  }
  void destroyEvent(void* event, const DeviceIndex /*device_index*/) const noexcept override {
    destroy_event(event);
  }
  void synchronizeEvent(void* event) const override {
    block_on_event(event, c10::Stream(c10::Stream::DEFAULT, Device(kNpu, t_current_device)));
  }
  bool queryStream(const c10::Stream& /*stream*/) const override {
    return true;
  }
  void synchronizeStream(const c10::Stream& stream) const override {
    flush_stream(stream);
  }
  void synchronizeDevice(const DeviceIndex device_index) const override {
    flush_device(device_index);
  }
  void recordDataPtrOnStream(const c10::DataPtr& /*data_ptr*/, const c10::Stream& /*stream*/)
      const override {
    note_record_stream();
  }
};

C10_REGISTER_GUARD_IMPL(PrivateUse1, NpuGuardImpl);

// ---------------------------------------------------------------------------
// PrivateUse1 hooks: what torch.accelerator, pin_memory and generators ask.
// ---------------------------------------------------------------------------

struct NpuHooks final : public at::PrivateUse1HooksInterface {
  bool isBuilt() const override {
    return true;
  }
  bool isAvailable() const override {
    return device_count() > 0;
  }
  bool hasPrimaryContext(DeviceIndex /*device_index*/) const override {
    return true;  // no lazy runtime context to create
  }
  void init() const override {}
  DeviceIndex deviceCount() const override {
    return device_count();
  }
  void setCurrentDevice(DeviceIndex device) const override {
    check_device_index(device);
    t_current_device = device;
  }
  DeviceIndex getCurrentDevice() const override {
    return t_current_device;
  }
  DeviceIndex exchangeDevice(DeviceIndex device) const override {
    const DeviceIndex old = t_current_device;
    setCurrentDevice(device);
    return old;
  }
  DeviceIndex maybeExchangeDevice(DeviceIndex device) const override {
    return exchangeDevice(device);
  }

  // One generator per device (a CPU generator object: random ops run on CPU
  // copies, with the device's generator standing in for the CPU's).
  const at::Generator& getDefaultGenerator(DeviceIndex device_index) const override {
    return device_generator(device_index < 0 ? t_current_device : device_index);
  }
  at::Generator getNewGenerator(DeviceIndex /*device_index*/) const override {
    return at::make_generator<at::CPUGeneratorImpl>(c10::detail::getNonDeterministicRandom());
  }

  Device getDeviceFromPtr(void* data) const override {
    auto index = g_allocator.device_of(data);
    return Device(kNpu, index.value_or(t_current_device));
  }

  bool isPinnedPtr(const void* data) const override {
    return g_pinned_allocator.contains(data);
  }
  at::Allocator* getPinnedMemoryAllocator() const override {
    return &g_pinned_allocator;
  }

  // UntypedStorage.resize_() on an npu storage.
  // Same as the CPU version: new block, copy the overlap, swap it in.
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t newsize) const override {
    c10::StorageImpl* impl = storage.unsafeGetStorageImpl();
    TORCH_CHECK(impl->resizable(), "npu: trying to resize storage that is not resizable");
    c10::DeviceGuard guard(storage.device());
    c10::DataPtr fresh = impl->allocator()->allocate(newsize);
    const size_t keep = std::min(newsize, impl->nbytes());
    if (keep > 0) {
      std::memcpy(fresh.get(), impl->data(), keep);
    }
    impl->set_data_ptr_noswap(std::move(fresh));
    impl->set_nbytes(newsize);
  }
};

// Registered when the module is imported (see PYBIND11_MODULE below): the
// hooks object must outlive every tensor, so it is never freed.
void register_hooks() {
  static NpuHooks* hooks = [] {
    auto* h = new NpuHooks();
    at::RegisterPrivateUse1HooksInterface(h);
    return h;
  }();
  (void)hooks;
}

// ---------------------------------------------------------------------------
// Native kernels for ops that create, alias or copy storage
// ---------------------------------------------------------------------------

// NPUs have no float64 units; refuse such tensors so that code which silently
// relies on doubles fails in CI rather than on the cluster. 0-dim tensors are
// exempt because upstream GradScaler.unscale_ computes 1/scale as a float64
// scalar on the device.
void check_dtype(at::ScalarType dtype, c10::IntArrayRef size) {
  TORCH_CHECK(
      (dtype != at::kDouble && dtype != at::kComplexDouble) || size.empty(),
      "npu: dtype ", dtype, " is not supported: Ascend NPUs have no float64 units "
      "(float64 and complex128 tensors cannot live on the device, except 0-dim scalars); "
      "use float32");
}

// Resolve device "npu" (no index) to the current device.
Device resolve_device(std::optional<Device> device) {
  Device d = device.value_or(Device(kNpu));
  TORCH_CHECK(d.type() == kNpu, "npu: expected an npu device, got ", d);
  if (!d.has_index()) {
    d = Device(kNpu, t_current_device);
  }
  check_device_index(d.index());
  return d;
}

at::Tensor empty_memory_format(
    c10::IntArrayRef size, std::optional<at::ScalarType> dtype, std::optional<at::Layout> layout,
    std::optional<Device> device, std::optional<bool> pin_memory,
    std::optional<at::MemoryFormat> memory_format) {
  const auto scalar_type = dtype.value_or(at::get_default_dtype_as_scalartype());
  check_dtype(scalar_type, size);
  TORCH_CHECK(layout.value_or(at::kStrided) == at::kStrided, "npu: only strided tensors are supported");
  TORCH_CHECK(!pin_memory.value_or(false), "npu: only CPU tensors can be pinned");
  c10::DeviceGuard guard(resolve_device(device));  // the allocator reads the current device
  return at::detail::empty_generic(
      size, &g_allocator, c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), scalar_type,
      memory_format);
}

at::Tensor empty_strided(
    c10::IntArrayRef size, c10::IntArrayRef stride, std::optional<at::ScalarType> dtype,
    std::optional<at::Layout> layout, std::optional<Device> device,
    std::optional<bool> pin_memory) {
  const auto scalar_type = dtype.value_or(at::get_default_dtype_as_scalartype());
  check_dtype(scalar_type, size);
  TORCH_CHECK(layout.value_or(at::kStrided) == at::kStrided, "npu: only strided tensors are supported");
  TORCH_CHECK(!pin_memory.value_or(false), "npu: only CPU tensors can be pinned");
  c10::DeviceGuard guard(resolve_device(device));
  return at::detail::empty_strided_generic(
      size, stride, &g_allocator, c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), scalar_type);
}

// A CPU tensor that aliases the same bytes (npu memory is host memory), so
// CPU kernels can read and write it without a copy.
at::Tensor host_alias(const at::Tensor& t) {
  if (t.is_cpu()) {
    return t;
  }
  TORCH_CHECK(t.device().type() == kNpu, "npu: cannot copy to/from device ", t.device());
  auto alias = at::from_blob(
      const_cast<void*>(t.const_data_ptr()), t.sizes(), t.strides(),
      at::TensorOptions().dtype(t.scalar_type()).device(DeviceType::CPU));
  alias._set_conj(t.is_conj());
  alias._set_neg(t.is_neg());
  return alias;
}

// Every copy involving an npu tensor lands here: cpu->npu, npu->cpu, npu->npu,
// with dtype conversion and any strides, all done by the CPU copy_ kernel. On a
// side stream (strict mode) a non_blocking or device-to-device copy stays
// invisible to other streams until they wait; a blocking copy makes the host
// wait for the stream. A device-to-host copy made by user code counts as a
// host synchronisation.
at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  if (dst.numel() == 0) {
    return dst;
  }
  const bool to_host = dst.is_cpu();
  StreamWork work(to_host ? self.device().index() : dst.device().index());
  if (to_host) {
    count_sync();
  }
  host_alias(dst).copy_(host_alias(self));
  if (self.is_cpu() && !non_blocking) {
    work.completed();
  } else if (to_host) {
    work.completed();
  } else {
    work.wrote(dst);
  }
  return dst;
}

at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  if (dst.sizes() != self.sizes()) {
    dst.resize_(self.sizes());
  }
  return copy_from(self, dst, false);
}

at::Scalar local_scalar_dense(const at::Tensor& self) {
  StreamWork work(self.device().index());
  work.completed();  // .item() waits for the current stream
  count_sync();
  return at::_local_scalar_dense(host_alias(self));
}

// Tensor.record_stream: the allocator frees at once (no cache to protect), so
// it only counts; a missing call cannot fail here (see the package docstring).
void record_stream(at::Tensor& /*self*/, c10::Stream /*stream*/) {
  note_record_stream();
}

// What every explicit kernel checks first: operands on one device. Returns that device.
DeviceIndex prepare_kernel(const char* name, std::initializer_list<const at::Tensor*> tensors) {
  check_same_device(name, tensors);
  for (const at::Tensor* t : tensors) {
    if (t != nullptr && t->defined() && t->device().type() == kNpu) {
      return t->device().index();
    }
  }
  return t_current_device;
}

const at::Tensor& resize_(
    const at::Tensor& self, c10::IntArrayRef size, std::optional<at::MemoryFormat> memory_format) {
  // Growing the storage allocates through storage->allocator(), i.e. our
  // allocator, which charges the current device: make that the tensor's.
  check_dtype(self.scalar_type(), size);
  c10::DeviceGuard guard(self.device());
  return at::native::resize_(self, size, memory_format);
}

at::Tensor& set_storage_offset(
    at::Tensor& self, c10::Storage source, int64_t storage_offset, c10::IntArrayRef size,
    c10::IntArrayRef stride) {
  // Pure metadata; the CPU helper never touches the bytes.
  return at::native::set_storage_cpu_(self, std::move(source), storage_offset, size, stride);
}

at::Tensor& set_storage(at::Tensor& self, c10::Storage source) {
  const int64_t numel = static_cast<int64_t>(source.nbytes() / self.dtype().itemsize());
  return set_storage_offset(self, std::move(source), 0, {numel}, {});
}

at::Tensor& set_tensor(at::Tensor& self, const at::Tensor& source) {
  return at::native::set_tensor_(self, source);
}

// set_() with no source: an empty storage on the tensor's own device (the CPU
// helper would allocate with the CPU allocator and change the device).
at::Tensor& set_empty(at::Tensor& self) {
  c10::DeviceGuard guard(self.device());
  c10::Storage storage(c10::Storage::use_byte_size_t(), 0, &g_allocator, /*resizable=*/true);
  return set_storage_offset(self, std::move(storage), 0, {0}, {});
}

// convolution_overrideable is where aten's convolution lands for a
// PrivateUse1 tensor; its default implementation throws. Run the ordinary CPU
// convolution on host copies instead (what the boxed fallback would do if the
// CPU had a kernel under this name).
at::Tensor convolution_overrideable(
    const at::Tensor& input, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
    c10::IntArrayRef stride, c10::IntArrayRef padding, c10::IntArrayRef dilation, bool transposed,
    c10::IntArrayRef output_padding, int64_t groups) {
  StreamWork work(prepare_kernel("aten::convolution", {&input, &weight, bias.has_value() ? &*bias : nullptr}));
  InternalCopies internal;
  std::optional<at::Tensor> bias_cpu;
  if (bias.has_value() && bias->defined()) {
    bias_cpu = bias->cpu();
  }
  auto out = at::convolution(
      input.cpu(), weight.cpu(), bias_cpu, stride, padding, dilation, transposed, output_padding,
      groups);
  auto result = out.to(input.device());
  note_result(result);
  work.wrote(result);
  return result;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> convolution_backward_overrideable(
    const at::Tensor& grad_output, const at::Tensor& input, const at::Tensor& weight,
    c10::IntArrayRef stride, c10::IntArrayRef padding, c10::IntArrayRef dilation, bool transposed,
    c10::IntArrayRef output_padding, int64_t groups, std::array<bool, 3> output_mask) {
  StreamWork work(prepare_kernel("aten::convolution_backward", {&grad_output, &input, &weight}));
  InternalCopies internal;
  // The bias has one entry per output channel.
  const int64_t out_channels = transposed ? weight.size(1) * groups : weight.size(0);
  auto grads = at::convolution_backward(
      grad_output.cpu(), input.cpu(), weight.cpu(), c10::IntArrayRef{out_channels}, stride,
      padding, dilation, transposed, output_padding, groups, output_mask);
  auto back = [&](const at::Tensor& t) {
    auto result = t.defined() ? t.to(input.device()) : t;
    note_result(result);
    work.wrote(result);
    return result;
  };
  return {back(std::get<0>(grads)), back(std::get<1>(grads)), back(std::get<2>(grads))};
}

// native_batch_norm updates running_mean / running_var in place, but its
// schema does not mark them as mutated, so the generic fallback would update
// only its CPU copies and drop the new statistics. Copy them back by hand.
std::tuple<at::Tensor, at::Tensor, at::Tensor> native_batch_norm(
    const at::Tensor& input, const std::optional<at::Tensor>& weight,
    const std::optional<at::Tensor>& bias, const std::optional<at::Tensor>& running_mean,
    const std::optional<at::Tensor>& running_var, bool training, double momentum, double eps) {
  auto present = [](const std::optional<at::Tensor>& t) { return t.has_value() ? &*t : nullptr; };
  StreamWork work(prepare_kernel("aten::native_batch_norm", {&input, present(weight), present(bias),
                                                             present(running_mean), present(running_var)}));
  InternalCopies internal;
  auto to_cpu = [](const std::optional<at::Tensor>& t) -> std::optional<at::Tensor> {
    if (t.has_value() && t->defined()) {
      return t->cpu();
    }
    return std::nullopt;
  };
  auto mean_cpu = to_cpu(running_mean);
  auto var_cpu = to_cpu(running_var);
  auto out = at::native_batch_norm(
      input.cpu(), to_cpu(weight), to_cpu(bias), mean_cpu, var_cpu, training, momentum, eps);
  if (training) {
    if (mean_cpu) {
      running_mean->copy_(*mean_cpu);
    }
    if (var_cpu) {
      running_var->copy_(*var_cpu);
    }
  }
  const auto device = input.device();
  std::tuple<at::Tensor, at::Tensor, at::Tensor> result{
      std::get<0>(out).to(device), std::get<1>(out).to(device), std::get<2>(out).to(device)};
  for (const at::Tensor* written : std::initializer_list<const at::Tensor*>{
           &std::get<0>(result), &std::get<1>(result), &std::get<2>(result), present(running_mean),
           present(running_var)}) {
    if (written != nullptr) {
      note_result(*written);
      work.wrote(*written);
    }
  }
  return result;
}

// The device of an op's first npu operand (the current device for factories).
DeviceIndex operand_device(const c10::OperatorHandle& op, const torch::jit::Stack& stack) {
  for (const c10::IValue& value : torch::jit::last(stack, op.schema().arguments().size())) {
    if (value.isTensor() && value.toTensor().defined() && value.toTensor().device().type() == kNpu) {
      return value.toTensor().device().index();
    }
  }
  return t_current_device;
}

// Tensors an op wrote: its results and the arguments its schema marks as mutated (each also passes the
// overflow check of a chip that saturates, npu_overflow.cpp).
void note_writes(const c10::OperatorHandle& op, const std::vector<c10::IValue>& mutated,
                 const torch::jit::Stack& stack, StreamWork& work) {
  auto mark = [&](const c10::IValue& value) {
    if (value.isTensor()) {
      note_result(value.toTensor());
      work.wrote(value.toTensor());
    } else if (value.isTensorList()) {
      for (const at::Tensor& t : value.toTensorVector()) {
        note_result(t);
        work.wrote(t);
      }
    }
  };
  for (const auto& value : mutated) {
    mark(value);
  }
  for (const auto& value : torch::jit::last(stack, op.schema().returns().size())) {
    mark(value);
  }
}

void npu_cpu_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  check_same_device(op, *stack);
  const DeviceIndex device = operand_device(op, *stack);
  std::vector<c10::IValue> mutated;
  const auto& arguments = op.schema().arguments();
  auto inputs = torch::jit::last(*stack, arguments.size());
  for (size_t i = 0; i < arguments.size(); ++i) {
    if (arguments[i].alias_info() != nullptr && arguments[i].alias_info()->isWrite()) {
      mutated.push_back(inputs[i]);
    }
  }
  StreamWork work(device);
  {
    InternalCopies internal;
    std::optional<DeviceRngScope> rng;
    if (is_random_op(op)) {
      rng.emplace(device);
    }
    at::native::cpu_fallback(op, stack);
  }
  note_writes(op, mutated, *stack, work);
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("empty.memory_format", TORCH_FN(empty_memory_format));
  m.impl("empty_strided", TORCH_FN(empty_strided));
  m.impl("_copy_from", TORCH_FN(copy_from));
  m.impl("_copy_from_and_resize", TORCH_FN(copy_from_and_resize));
  m.impl("_local_scalar_dense", TORCH_FN(local_scalar_dense));
  m.impl("resize_", TORCH_FN(resize_));
  // Views must share storage, so they cannot go through the (copying) fallback.
  m.impl("as_strided", TORCH_FN(at::native::as_strided_tensorimpl));
  m.impl("view", TORCH_FN(at::native::view));
  m.impl("_reshape_alias", TORCH_FN(at::native::_reshape_alias));
  m.impl("unfold", TORCH_FN(at::native::unfold));
  m.impl("view_as_real", TORCH_FN(at::native::view_as_real));
  m.impl("view_as_complex", TORCH_FN(at::native::view_as_complex));
  m.impl("set_.source_Storage", TORCH_FN(set_storage));
  m.impl("set_.source_Storage_storage_offset", TORCH_FN(set_storage_offset));
  m.impl("set_.source_Tensor", TORCH_FN(set_tensor));
  m.impl("set_", TORCH_FN(set_empty));
  m.impl("convolution_overrideable", TORCH_FN(convolution_overrideable));
  m.impl("convolution_backward_overrideable", TORCH_FN(convolution_backward_overrideable));
  m.impl("native_batch_norm", TORCH_FN(native_batch_norm));
  m.impl("record_stream", TORCH_FN(record_stream));
}

// Everything else runs on CPU copies of the npu tensors; results (and
// mutated inputs) are copied back with _copy_from / _copy_from_and_resize.
TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&npu_cpu_fallback>());
}

// Structured ops (add, mul, mse_loss, ...) reach a backend through a
// CompositeExplicitAutogradNonFunctional wrapper that allocates the output on
// the device and calls the out= overload, which the fallback then runs on CPU
// copies of all arguments, output included. Send the functional and in-place
// overloads straight to the fallback instead: one copy less, and no out=
// quirks (mse_loss.out warns about resizing the 0-dim output it was given).
// View ops are left alone: the fallback cannot keep aliasing.
void route_structured_ops_to_fallback() {
  static bool done = false;
  if (done) {
    return;
  }
  done = true;
  // Never destroyed: the registrations must live as long as the process.
  auto* lib = new torch::Library(
      torch::Library::IMPL, "aten", c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
  auto& dispatcher = c10::Dispatcher::singleton();
  for (const auto& name : dispatcher.getRegistrationsForDispatchKey(
           c10::DispatchKey::CompositeExplicitAutogradNonFunctional)) {
    if (name.name.rfind("aten::", 0) != 0) {
      continue;
    }
    auto op = dispatcher.findOp(name);
    if (!op || !op->hasKernelForDispatchKey(c10::DispatchKey::CPU) ||
        op->hasKernelForDispatchKey(c10::DispatchKey::PrivateUse1)) {
      continue;
    }
    bool returns_view = false;
    for (const auto& ret : op->schema().returns()) {
      if (ret.alias_info() != nullptr && !ret.alias_info()->isWrite()) {
        returns_view = true;
      }
    }
    if (returns_view) {
      continue;
    }
    std::string qualified = name.name.substr(6);  // drop "aten::"
    if (!name.overload_name.empty()) {
      qualified += "." + name.overload_name;
    }
    lib->impl(qualified.c_str(), torch::CppFunction::makeFromBoxedFunction<&npu_cpu_fallback>());
  }
}

}  // namespace vtools_npu

// ---------------------------------------------------------------------------
// Python bindings (used by tests/emulated_npu/device.py, i.e. torch.npu)
// ---------------------------------------------------------------------------

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  using namespace vtools_npu;
  register_hooks();
  route_structured_ops_to_fallback();
  register_autocast_fallthrough();
  m.doc() = "vtools emulated Ascend NPU (PrivateUse1 backend in host memory)";
  m.def("device_count", [] { return static_cast<int>(device_count()); });
  m.def("current_device", [] { return static_cast<int>(t_current_device); });
  m.def("set_device", [](int index) {
    check_device_index(static_cast<DeviceIndex>(index));
    t_current_device = static_cast<DeviceIndex>(index);
  });
  m.def("memory_allocated", [](int index) {
    return g_allocator.allocated(static_cast<DeviceIndex>(index));
  });
  m.def("max_memory_allocated", [](int index) {
    return g_allocator.peak(static_cast<DeviceIndex>(index));
  });
  m.def("reset_peak_memory_stats", [](int index) {
    g_allocator.resetPeakStats(static_cast<DeviceIndex>(index));
  });
  m.def("mem_get_info", [](int index) {
    auto info = g_allocator.getMemoryInfo(static_cast<DeviceIndex>(index));
    return pybind11::make_tuple(info.first, info.second);
  });
  m.def("total_memory", [] { return kTotalMemory; });
  m.def("sync_count", [] { return sync_count(); });
  m.def("hidden_storages", [] { return hidden_storages(); });
  m.def("recorded_streams", [] { return recorded_streams(); });
  m.def("synchronize", [](int index) { flush_device(static_cast<DeviceIndex>(index)); });
  m.def("generator_state", [](int index) {
    at::Generator generator = device_generator(static_cast<DeviceIndex>(index));
    std::lock_guard<std::mutex> lock(generator.mutex());
    return generator.get_state();
  });
  m.def("set_generator_state", [](int index, const at::Tensor& state) {
    at::Generator generator = device_generator(static_cast<DeviceIndex>(index));
    std::lock_guard<std::mutex> lock(generator.mutex());
    generator.set_state(state);
  });
  m.def("manual_seed", [](int index, uint64_t seed) {
    at::Generator generator = device_generator(static_cast<DeviceIndex>(index));
    std::lock_guard<std::mutex> lock(generator.mutex());
    generator.set_current_seed(seed);
  });
  m.def("initial_seed", [](int index) { return device_generator(static_cast<DeviceIndex>(index)).current_seed(); });
  m.def("set_overflow_mode", [](bool saturates, bool records_flag) { set_overflow_mode(saturates, records_flag); });
  m.def("saturates", [] { return saturates(); });
  m.def("overflow_flag", [](int index) { return overflow_flag(static_cast<DeviceIndex>(index)); });
  // what an HCCL reduction on a saturating chip does to its result (process_group.py)
  m.def("note_result", [](const at::Tensor& t) { note_result(t); });
}
