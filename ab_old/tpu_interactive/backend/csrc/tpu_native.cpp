// The C++ half of the tpu (PrivateUse1) device: the hooks torch only looks up in C++.
//
// A pure-Python PrivateUse1 backend cannot register a DeviceAllocator (torch.accelerator's memory
// calls), pinned host memory, device generators, device synchronisation or events. This module
// registers them; everything that concerns device data calls back into Python (backend/native.py),
// so the numbers are the ones torch.tpu reports. It must be installed before torch's Python hooks
// (torch keeps the first PrivateUse1 hooks registered).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <frameobject.h>

#include <ATen/EmptyTensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <ATen/Context.h>
#include <ATen/SDPBackend.h>
#include <ATen/native/transformers/attention.h>
#include <ATen/ops/as_strided_ops.h>
#include <ATen/ops/view_ops.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/GeneratorImpl.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/csrc/Event.h>
#include <torch/csrc/Storage.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <unordered_map>

namespace py = pybind11;

namespace {

constexpr c10::DeviceType kTpu = c10::DeviceType::PrivateUse1;

// Python callbacks (an object with methods), leaked on purpose: torch calls the hooks until exit.
py::object* g_callbacks = nullptr;

// Runs f(callbacks) holding the GIL (every Python object must die inside); a Python exception
// becomes a c10::Error carrying its message.
template <typename F>
auto with_python(F&& f) {
  TORCH_CHECK(g_callbacks != nullptr, "tpu_interactive native hooks used before install()");
  py::gil_scoped_acquire gil;
  try {
    return f(*g_callbacks);
  } catch (py::error_already_set& e) {
    TORCH_CHECK(false, e.what());
  }
}

void call_python(const char* name) {
  with_python([name](py::object& cb) { cb.attr(name)(); });
}

void sync_device() {
  call_python("synchronize");
}

// ------------------------------------------------------------------ device allocator
// Device data lives in JAX buffers owned by Python storages; this allocator exists so that
// c10::getDeviceAllocator(tpu) (torch.accelerator.memory_*) finds the backend's accounting.
void no_delete(void*) {}

struct TpuDeviceAllocator final : c10::DeviceAllocator {
  c10::DataPtr allocate(size_t nbytes) override {
    TORCH_CHECK(
        nbytes == 0,
        "tpu device memory is allocated by tpu_interactive's storages (tensor factories, "
        "torch.UntypedStorage(n, device='tpu')), not by the C++ allocator (asked for ",
        nbytes, " bytes)");
    return {nullptr, nullptr, &no_delete, c10::Device(kTpu, 0)};
  }
  c10::DeleterFnPtr raw_deleter() const override {
    return &no_delete;
  }
  void copy_data(void*, const void*, std::size_t count) const override {
    TORCH_CHECK(count == 0, "tpu memory cannot be copied by the C++ allocator");
  }
  bool initialized() override {
    return g_callbacks != nullptr;
  }
  void emptyCache(c10::MempoolId_t) override {
    call_python("empty_cache");
  }
  void recordStream(const c10::DataPtr&, c10::Stream) override {}  // one in-order stream
  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex) override {
    // (allocated: current, peak, total, freed), (buffers: current, peak, total, freed),
    // (reserved: current, peak): the backend's own counters
    c10::CachingDeviceAllocator::DeviceStats stats;
    auto fill = [](c10::CachingAllocator::StatArray& arr, py::handle h) {
      auto v = h.cast<py::tuple>();
      for (auto& s : arr) {
        s.current = v[0].cast<int64_t>();
        s.peak = v[1].cast<int64_t>();
        s.allocated = v[2].cast<int64_t>();
        s.freed = v[3].cast<int64_t>();
      }
    };
    with_python([&](py::object& cb) {
      py::tuple t = cb.attr("device_stats")();
      fill(stats.allocated_bytes, t[0]);
      fill(stats.active_bytes, t[0]);
      fill(stats.requested_bytes, t[0]);
      fill(stats.allocation, t[1]);
      fill(stats.active, t[1]);
      fill(stats.reserved_bytes, t[2]);
      fill(stats.segment, t[1]);
      stats.num_device_alloc = stats.allocation[0].allocated;
      stats.num_device_free = stats.allocation[0].freed;
    });
    return stats;
  }
  void resetAccumulatedStats(c10::DeviceIndex) override {
    call_python("reset_accumulated_stats");
  }
  void resetPeakStats(c10::DeviceIndex) override {
    call_python("reset_peak_stats");
  }
  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex) override {
    return with_python([](py::object& cb) {
      py::tuple t = cb.attr("mem_get_info")();
      return std::pair<size_t, size_t>{t[0].cast<size_t>(), t[1].cast<size_t>()};
    });
  }
};

TpuDeviceAllocator g_device_allocator;

// ------------------------------------------------------------------ pinned host memory
// Page-aligned host blocks, remembered so that is_pinned() can answer for any pointer inside one.
// A non_blocking copy from such a block is handed to the device without a staging copy.
struct PinnedAllocator final : c10::Allocator {
  static std::mutex& lock() {
    static std::mutex m;
    return m;
  }
  static std::map<uintptr_t, size_t>& blocks() {
    static auto* b = new std::map<uintptr_t, size_t>();
    return *b;
  }
  static void release(void* ptr) {
    if (ptr == nullptr)
      return;
    {
      std::lock_guard<std::mutex> guard(lock());
      blocks().erase(reinterpret_cast<uintptr_t>(ptr));
    }
    std::free(ptr);
  }
  c10::DataPtr allocate(size_t nbytes) override {
    void* ptr = nullptr;
    if (nbytes > 0) {
      TORCH_CHECK_WITH(OutOfMemoryError, posix_memalign(&ptr, 4096, nbytes) == 0,
                       "could not allocate ", nbytes, " bytes of pinned host memory");
      std::lock_guard<std::mutex> guard(lock());
      blocks()[reinterpret_cast<uintptr_t>(ptr)] = nbytes;
    }
    return {ptr, ptr, &release, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override {
    return &release;
  }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
  static bool contains(const void* ptr) {
    auto p = reinterpret_cast<uintptr_t>(ptr);
    std::lock_guard<std::mutex> guard(lock());
    auto it = blocks().upper_bound(p);
    if (it == blocks().begin())
      return false;
    --it;
    return p >= it->first && p < it->first + it->second;
  }
};

PinnedAllocator g_pinned_allocator;

// ------------------------------------------------------------------ device generator
// State = (seed, offset). The random lowerings draw fold_in(key(seed), offset) and advance offset,
// the same scheme as the default device generator (backend/rng.py).
struct TpuGenerator final : c10::GeneratorImpl {
  TpuGenerator()
      : c10::GeneratorImpl(c10::Device(kTpu, 0), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)) {}
  void set_current_seed(uint64_t seed) override {
    seed_ = seed;
    offset_ = 0;
  }
  void set_offset(uint64_t offset) override {
    offset_ = offset;
  }
  uint64_t get_offset() const override {
    return offset_;
  }
  uint64_t current_seed() const override {
    return seed_;
  }
  uint64_t seed() override {
    set_current_seed(c10::detail::getNonDeterministicRandom());
    return seed_;
  }
  void set_state(const c10::TensorImpl& state) override {
    TORCH_CHECK_TYPE(state.layout() == c10::kStrided && state.device().type() == c10::DeviceType::CPU &&
                         state.dtype() == c10::kByte,
                     "RNG state must be a torch.ByteTensor");  // CUDA's checks and words
    TORCH_CHECK(state.numel() == 16, "RNG state is wrong size");
    uint64_t words[2];
    std::memcpy(words, state.data(), sizeof(words));
    seed_ = words[0];
    offset_ = words[1];
  }
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override {
    auto state = at::detail::empty_cpu({16}, c10::ScalarType::Byte, std::nullopt, std::nullopt,
                                       std::nullopt, std::nullopt);
    uint64_t words[2] = {seed_, offset_};
    std::memcpy(state.mutable_data_ptr(), words, sizeof(words));
    return state.getIntrusivePtr();
  }
  static c10::DeviceType device_type() {
    return kTpu;
  }

 private:
  TpuGenerator* clone_impl() const override {
    auto* copy = new TpuGenerator();
    copy->seed_ = seed_;
    copy->offset_ = offset_;
    return copy;
  }
  uint64_t seed_ = 67280421310721ULL;  // torch's default seed
  uint64_t offset_ = 0;
};

// ------------------------------------------------------------------ hooks
struct TpuHooks final : at::PrivateUse1HooksInterface {
  bool isBuilt() const override {
    return true;
  }
  bool isAvailable() const override {
    return true;
  }
  bool hasPrimaryContext(c10::DeviceIndex) const override {
    return true;
  }
  void init() const override {}
  c10::DeviceIndex deviceCount() const override {
    return 1;
  }
  c10::DeviceIndex getCurrentDevice() const override {
    return 0;
  }
  void setCurrentDevice(c10::DeviceIndex index) const override {
    check_index(index);
  }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex index) const override {
    check_index(index);
    return 0;
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex) const override {
    return 0;
  }
  bool isPinnedPtr(const void* data) const override {
    return PinnedAllocator::contains(data);
  }
  c10::Allocator* getPinnedMemoryAllocator() const override {
    return &g_pinned_allocator;
  }
  c10::Device getDeviceFromPtr(void*) const override {
    return c10::Device(kTpu, 0);
  }
  // storage.resize_(n) (FSDP2 frees and re-allocates unsharded parameters this way): Python gives
  // the storage a new buffer and fake address range; the StorageImpl then points at that range.
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t newsize) const override {
    auto address = with_python([&](py::object& cb) {
      auto wrapped = py::reinterpret_steal<py::object>(THPStorage_Wrap(storage));
      return cb.attr("resize_storage")(wrapped, newsize).cast<uintptr_t>();
    });
    auto* impl = storage.unsafeGetStorageImpl();
    impl->set_data_ptr_noswap(
        c10::DataPtr(reinterpret_cast<void*>(address), c10::Device(kTpu, 0)));
    impl->set_nbytes(newsize);
  }
  at::Generator getNewGenerator(c10::DeviceIndex index) const override {
    check_index(index);
    return at::make_generator<TpuGenerator>();
  }
  static void check_index(c10::DeviceIndex index) {
    TORCH_CHECK(index == 0 || index == -1, "Invalid device index ", static_cast<int>(index),
                ": the tpu backend exposes one torch device (tpu:0)");
  }
};

// ------------------------------------------------------------------ device guard, streams, events
// One in-order stream per device (XLA orders a device's work): every stream is the default stream,
// waiting on an event is a no-op, and synchronising waits for all pending device work.
struct TpuEvent {
  bool timing;
  bool recorded = false;
  bool synced = false;
  double ms = 0;
};

double now_ms() {
  using clock = std::chrono::steady_clock;
  return std::chrono::duration<double, std::milli>(clock::now().time_since_epoch()).count();
}

struct TpuGuard final : c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override {
    return kTpu;
  }
  c10::Device exchangeDevice(c10::Device device) const override {
    TpuHooks::check_index(device.index());
    return c10::Device(kTpu, 0);
  }
  c10::Device getDevice() const override {
    return c10::Device(kTpu, 0);
  }
  void setDevice(c10::Device device) const override {
    TpuHooks::check_index(device.index());
  }
  void uncheckedSetDevice(c10::Device) const noexcept override {}
  c10::Stream getStream(c10::Device) const override {
    return c10::Stream(c10::Stream::DEFAULT, c10::Device(kTpu, 0));
  }
  c10::Stream getDefaultStream(c10::Device device) const override {
    return getStream(device);
  }
  c10::Stream getStreamFromGlobalPool(c10::Device device, bool) const override {
    return getStream(device);
  }
  c10::Stream getNewStream(c10::Device device, int) const override {
    return getStream(device);
  }
  c10::Stream exchangeStream(c10::Stream) const override {
    return getStream(c10::Device(kTpu, 0));
  }
  c10::DeviceIndex deviceCount() const noexcept override {
    return 1;
  }
  void record(void** event, const c10::Stream&, const c10::DeviceIndex,
              const c10::EventFlag flag) const override {
    if (*event == nullptr)
      *event = new TpuEvent{flag == c10::EventFlag::BACKEND_DEFAULT};
    auto* e = static_cast<TpuEvent*>(*event);
    e->recorded = true;
    e->synced = false;
    if (e->timing) {  // a timestamp is only meaningful once the work before it has finished
      sync_device();
      e->ms = now_ms();
      e->synced = true;
    }
  }
  void block(void*, const c10::Stream&) const override {}  // one in-order stream
  bool queryEvent(void* event) const override {
    synchronizeEvent(event);  // answers "done?" by waiting for it: true is then exact
    return true;
  }
  void synchronizeEvent(void* event) const override {
    auto* e = static_cast<TpuEvent*>(event);
    if (e != nullptr && e->recorded && !e->synced) {
      sync_device();
      e->synced = true;
    }
  }
  void destroyEvent(void* event, const c10::DeviceIndex) const noexcept override {
    delete static_cast<TpuEvent*>(event);
  }
  bool queryStream(const c10::Stream&) const override {
    sync_device();
    return true;
  }
  void synchronizeStream(const c10::Stream&) const override {
    sync_device();
  }
  void synchronizeDevice(const c10::DeviceIndex) const override {
    sync_device();
  }
  double elapsedTime(void* start, void* end, const c10::DeviceIndex) const override {
    auto* a = static_cast<TpuEvent*>(start);
    auto* b = static_cast<TpuEvent*>(end);
    TORCH_CHECK(a != nullptr && b != nullptr && a->recorded && b->recorded,
                "Both events must be recorded before calculating elapsed time.");
    TORCH_CHECK(a->timing && b->timing,
                "Both events must be created with argument 'enable_timing=True'.");
    return b->ms - a->ms;
  }
};

bool install(py::object callbacks) {
  if (at::isPrivateUse1HooksRegistered())
    return false;  // too late: torch keeps the first hooks (e.g. the Python ones)
  g_callbacks = new py::object(std::move(callbacks));
  at::RegisterPrivateUse1HooksInterface(new TpuHooks());
  c10::impl::registerDeviceGuard(kTpu, new TpuGuard());
  c10::SetAllocator(kTpu, &g_device_allocator, /*priority=*/1);
  return true;
}

// A view op's PrivateUse1 kernel: CPU's kernel, which only makes a TensorImpl aliasing the same
// storage (geometry checks included). Going there through Python cost ~5 us per view: transpose,
// permute and friends call as_strided, so a transformer step made dozens of such calls.
void redispatch_to_cpu(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);
}

// The two views a step calls most (every reshape, transpose and permute ends in one of them): unboxed, so
// their arguments are not boxed into IValues and back for each call (~1.5% of a fused training step).
at::Tensor view_on_cpu(const at::Tensor& self, c10::SymIntArrayRef size) {
  return at::_ops::view::redispatch(c10::DispatchKeySet(c10::DispatchKey::CPU), self, size);
}

at::Tensor as_strided_on_cpu(const at::Tensor& self, c10::SymIntArrayRef size, c10::SymIntArrayRef stride,
                             std::optional<c10::SymInt> storage_offset) {
  return at::_ops::as_strided::redispatch(c10::DispatchKeySet(c10::DispatchKey::CPU), self, size, stride,
                                          std::move(storage_offset));
}

void register_cpu_views(const std::vector<std::string>& names) {
  static auto* library = new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::PrivateUse1,
                                            __FILE__, __LINE__);  // leaked: torch may view during exit
  for (const auto& name : names) {
    if (name == "view")
      library->impl("view", TORCH_FN(view_on_cpu));
    else if (name == "as_strided")
      library->impl("as_strided", TORCH_FN(as_strided_on_cpu));
    else
      library->impl(name.c_str(), torch::CppFunction::makeFromBoxedFunction<&redispatch_to_cpu>());
  }
}

// torch's composite scaled_dot_product_attention asks a device's DispatchStub which kernel to run;
// a backend without one always takes the math op (~15 small ops, or our Python autograd.Function).
// Our answer "overrideable" sends the calls our one-program kernel covers to
// aten::_scaled_dot_product_fused_attention_overrideable, an ordinary lowered op with torch's own C++
// autograd formula: recorded and run from C++ plans like any op. Calls it does not cover keep the math
// op (dropout, GQA, broadcast batch/heads, other ranks, empty inputs, traced tensors).
bool sdp_traced(const at::Tensor& t) {
  static const c10::DispatchKeySet kTracing({c10::DispatchKey::Python, c10::DispatchKey::Functionalize,
                                             c10::DispatchKey::FuncTorchGradWrapper, c10::DispatchKey::FuncTorchBatched});
  return !(t.key_set() & kTracing).empty();
}

bool sdp_mask_broadcasts(const at::Tensor& mask, const at::Tensor& q, const at::Tensor& k) {
  const int64_t full[4] = {q.size(0), q.size(1), q.size(2), k.size(2)};
  if (mask.dim() > 4)
    return false;
  for (int64_t i = 1; i <= mask.dim(); ++i) {
    int64_t size = mask.size(-i);
    if (size != 1 && size != full[4 - i])
      return false;
  }
  return true;
}

int64_t tpu_sdp_choice(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                       const std::optional<at::Tensor>& mask, double dropout_p, bool is_causal,
                       std::optional<double> scale, bool enable_gqa) {
  auto& ctx = at::globalContext();
  bool fused_enabled = ctx.userEnabledOverrideableSDP() || ctx.userEnabledFlashSDP() ||
                       ctx.userEnabledMemEfficientSDP() || ctx.userEnabledCuDNNSDP();
  bool has_mask = mask.has_value() && mask->defined();
  bool covered = fused_enabled && dropout_p == 0.0 && q.dim() == 4 && k.dim() == 4 && v.dim() == 4 &&
                 !sdp_traced(q) && !sdp_traced(k) && !sdp_traced(v) && !(has_mask && sdp_traced(*mask)) &&
                 q.is_floating_point() && q.numel() > 0 && k.numel() > 0 && v.numel() > 0 &&
                 q.size(0) == k.size(0) && k.size(0) == v.size(0) && q.size(1) == k.size(1) &&
                 k.size(1) == v.size(1) && k.size(2) == v.size(2) && q.size(3) == k.size(3) &&
                 !(has_mask && (is_causal || !sdp_mask_broadcasts(*mask, q, k)));
  if (covered)
    return static_cast<int64_t>(at::SDPBackend::overrideable);
  TORCH_CHECK(ctx.userEnabledMathSDP(), "No available kernel. Aborting execution.");  // CPU's and CUDA's words
  return static_cast<int64_t>(at::SDPBackend::math);
}

void register_sdp_choice() {
  at::native::_fused_sdp_choice_stub.set_privateuse1_dispatch_ptr(&tpu_sdp_choice);
}

}  // namespace

namespace tpu_native {

// errors.user_site's frame walk: a fused segment records the user's line of every op, and under
// transformers (internal code) that line is ~25 frames up: ~6.7 us a recorded op in Python, most of a
// fused generate() step's recording. Whether a code object is internal is asked of `classify`
// (errors.is_internal on its file) once; the answer is kept with a reference to the code object, so
// its address is never reused while it is a key here.
std::unordered_map<PyCodeObject*, bool>* g_code_internal = new std::unordered_map<PyCodeObject*, bool>();

py::object user_site(int skip, py::handle classify) {
  PyFrameObject* frame = PyEval_GetFrame();  // borrowed: the Python function calling this one
  Py_XINCREF(frame);
  for (; skip > 0 && frame != nullptr; --skip) {
    PyFrameObject* back = PyFrame_GetBack(frame);
    Py_DECREF(frame);
    frame = back;
  }
  while (frame != nullptr) {
    PyCodeObject* code = PyFrame_GetCode(frame);  // new reference
    auto found = g_code_internal->find(code);
    bool internal;
    if (found != g_code_internal->end()) {
      internal = found->second;
      Py_DECREF(code);
    } else {
      try {
        internal = py::reinterpret_borrow<py::object>(classify)(py::handle(code->co_filename)).cast<bool>();
      } catch (...) {  // classify raised: the walk's references go before the error does
        Py_DECREF(code);
        Py_DECREF(frame);
        throw;
      }
      if (g_code_internal->size() > 100000) {
        for (auto& entry : *g_code_internal)
          Py_DECREF(entry.first);
        g_code_internal->clear();
      }
      g_code_internal->emplace(code, internal);  // keeps the reference
    }
    if (!internal) {
      int line = PyFrame_GetLineNumber(frame);
      PyCodeObject* site = PyFrame_GetCode(frame);
      py::tuple result = py::make_tuple(py::handle(site->co_filename), line, py::handle(site->co_name));
      Py_DECREF(site);
      Py_DECREF(frame);
      return std::move(result);
    }
    PyFrameObject* back = PyFrame_GetBack(frame);
    Py_DECREF(frame);
    frame = back;
  }
  return py::none();
}

}  // namespace tpu_native

void register_fast_dispatch(py::module_& m);  // fast_dispatch.cpp
void register_fused_record(py::module_& m);    // fused_record.cpp
void register_boxed_front(py::module_& m);     // boxed_front.cpp
void register_python_front(py::module_& m);    // python_front.cpp
namespace tpu_native {
bool register_memory_counters(PyObject* module);  // memory_counters.cpp
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  register_fast_dispatch(m);
  register_fused_record(m);
  register_python_front(m);
  register_boxed_front(m);
  TORCH_CHECK(tpu_native::register_memory_counters(m.ptr()), "memory counters");
  m.def("install", &install, "register the tpu hooks, device guard and allocator with torch");
  // torch.Event.elapsed_time accepts only an exact torch.Event as its argument; torch.tpu.Event is a
  // subclass, so it times through here
  m.def("elapsed_time", [](py::handle start, py::handle end) {
    TORCH_CHECK(THPEvent_Check(start.ptr()) && THPEvent_Check(end.ptr()),
                "expected other to be a torch.Event object");
    const auto& a = reinterpret_cast<THPEvent*>(start.ptr())->event;
    return a.elapsedTime(reinterpret_cast<THPEvent*>(end.ptr())->event);
  });
  m.def("register_cpu_views", &register_cpu_views, "PrivateUse1 kernels of these aten views: CPU's, from C++");
  m.def("user_site", &tpu_native::user_site, "errors.user_site's walk: (file, line, function) of the innermost frame, "
        "`skip` frames above the caller, whose code `classify(filename)` calls not internal; or None");
  m.def("is_pinned_ptr", [](uintptr_t ptr) { return PinnedAllocator::contains(reinterpret_cast<void*>(ptr)); });
  m.def("register_sdp_choice", &register_sdp_choice, "scaled_dot_product_attention's kernel choice for tpu "
        "tensors: the fused overrideable op for the calls its lowering covers, else the math op");
}
