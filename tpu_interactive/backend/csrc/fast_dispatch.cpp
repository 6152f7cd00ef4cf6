// The warm eager path in C++ (backend/fast_path.py is its Python half): plans, keys, running a plan.
//
// A warm eager op spent most of its time in Python bookkeeping around one jitted call: building the
// meta-cache key, reading buffers, promoting, wrapping the result. Here a call is keyed by
// everything that decides its program and output metadata (op, input shapes/dtypes/devices,
// scalar arguments by value, the Pallas switch); a key seen before runs its recorded *plan*: the
// op's jitted program on the inputs' jax arrays, whose results become fresh tpu tensors. Two front
// ends key calls and run plans with what is here: python_front.cpp (the FastKernel object, on the
// Python arguments a Python kernel gets; a miss runs the Python kernel, which offers the call's plan)
// and boxed_front.cpp (the kernel torch calls, on its IValues). Anything unusual (lazy bits, fused or
// synchronous mode, subclasses, unknown argument types) is "not eligible": the Python path runs.
#include "fast_dispatch.h"

#include <structmember.h>

#include <torch/csrc/Device.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/Storage.h>
#include <torch/csrc/autograd/python_variable.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <deque>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace py = pybind11;

namespace tpu_native {

// The offsets of a class's __slots__ `names` (plain object slots), for objects made and read without
// running Python (fused_record.cpp's Lazy values too); false if the class does not have them so.
bool find_slots(PyObject* type, const char* const* names, int n, Py_ssize_t* offsets) {
  PyObject* dict = reinterpret_cast<PyTypeObject*>(type)->tp_dict;
  for (int i = 0; i < n; ++i) {
    PyObject* descr = PyDict_GetItemString(dict, names[i]);
    if (descr == nullptr || Py_TYPE(descr) != &PyMemberDescr_Type)
      return false;
    PyMemberDef* member = reinterpret_cast<PyMemberDescrObject*>(descr)->d_member;
    if (member->type != T_OBJECT_EX)
      return false;
    offsets[i] = member->offset;
  }
  return true;
}

// A new instance of `type` with its n slots (at `offsets`) set to `values`, __init__ not run.
PyObject* new_with_slots(PyObject* type, const Py_ssize_t* offsets, PyObject* const* values, int n) {
  auto* cls = reinterpret_cast<PyTypeObject*>(type);
  PyObject* made = cls->tp_alloc(cls, 0);
  if (made == nullptr)
    return nullptr;
  for (int i = 0; i < n; ++i) {
    Py_INCREF(values[i]);
    *reinterpret_cast<PyObject**>(reinterpret_cast<char*>(made) + offsets[i]) = values[i];
  }
  return made;
}

int note_write(PyObject* buffer, PyObject* previous);  // fused_record.cpp
void count_alloc(int64_t nbytes);                       // memory_counters.cpp

}  // namespace tpu_native

namespace tpu_fast {

thread_local Scratch t_scratch;
thread_local bool t_scratch_busy = false;

constexpr size_t kPlansPerOp = 512;  // a loop with ever-new scalars starts over instead of growing

// A deque: registering an op never moves the others. Leaked: torch may call kernels during exit.
std::deque<Op>* g_ops = new std::deque<Op>();
std::vector<Op*>* g_unfolded = new std::vector<Op*>();  // the ops with calls_unfolded > 0
bool g_enabled = false;
bool g_recording = false;            // fused mode records: keys and plans are record plans
int64_t g_mode = 0;
PyObject* g_array_type = nullptr;    // jax's concrete array type
PyObject* g_make_storage = nullptr;  // storage._device_storage(array, shape, dtype)
PyObject* g_buffer_type = nullptr;   // storage.DeviceBuffer
PyObject* g_history = nullptr;       // memory_history's module dict (RECORDING)
bool g_storage_in_python = true;     // a memory limit is set: storages come from g_make_storage
int64_t g_next_address = 0;          // storage._reserve's counter, kept here once installed
int64_t g_donated = 0;               // in-place calls that donated self's buffer's array
int64_t g_recorded = 0;              // calls recorded into a fused segment by a record plan
PyObject* g_lazy_type = nullptr;     // fusion.Lazy: a recorded value in a buffer (fused mode)
PyObject* g_note_write = nullptr;    // fusion.note_write(buffer, previous)
PyObject* g_weak_type_attr = nullptr;
PyObject* g_aval_attr = nullptr;
PyObject* g_value_attr = nullptr;
PyObject* g_counts = nullptr;        // STATS.op_counts
PyObject* g_seconds = nullptr;       // STATS.op_seconds
PyObject* g_record_path = nullptr;   // stats.record_kernel_path(op, path)
std::vector<PyObject*> g_singleton_types;  // torch.dtype, torch.layout, torch.memory_format
PyObject* g_buffer_attr = nullptr;
PyObject* g_array_attr = nullptr;
PyObject* g_shape_attr = nullptr;
PyObject* g_dtype_attr = nullptr;
PyObject* g_recording_name = nullptr;
PyObject* g_device_scalar = nullptr;  // op_jit._device_scalar(value)
// The running op's floats are keyed by type and passed as device scalars (its lowering declared
// that floats never change its output metadata, and its program takes them as inputs).
thread_local bool t_floats_by_type = false;
// An input whose buffer holds a Lazy value outside fused recording (compile_ahead.py: a deferred call's
// result): the call gets its key, for the Python kernel to offer a plan under once it has run, but
// never runs a plan itself
thread_local bool t_saw_lazy = false;
// An in-place call's self storages (one, or one per tensor of a foreach op's list, each with its first
// position there): each tensor's key says which one it shares, if any. Aliasing decides torch's overlap
// errors, and whether a foreach op's elements may run as one program (foreach.py), so a plan is only
// reused for the same aliasing.
thread_local std::unordered_map<const c10::StorageImpl*, int32_t> t_self_storages;

// storage.DeviceBuffer's six __slots__, written and read in place (their offsets are read from the class
// once; if the class ever stops matching, its constructor and attributes are used instead)
enum BufferSlot { kBufferArray, kBufferPending, kBufferShape, kBufferDtype, kBufferNbytes, kBufferAddress, kBufferSlots };
const char* const kBufferSlotNames[kBufferSlots] = {"array", "pending", "shape", "dtype", "nbytes", "address"};
Py_ssize_t g_buffer_offsets[kBufferSlots];
bool g_buffer_direct = false;

inline PyObject* buffer_slot(PyObject* buffer, int slot) {  // borrowed, or null where unset
  return *reinterpret_cast<PyObject**>(reinterpret_cast<char*>(buffer) + g_buffer_offsets[slot]);
}

// The jax array of tpu tensor t's buffer (a new reference), its geometry appended to the key: "T"
// for a plain tensor (the whole buffer, same dtype, contiguous, no lazy bits); "V" + the buffer's
// dtype and shape + t's strides, offset and lazy bits for a view (where `views` allows one: the
// program then reads the view from the buffer's array). nullptr, no Python error set, when the
// buffer holds no concrete array (never written, a copy in flight, a recorded fused value).
PyObject* buffer_array(const at::Tensor& t, std::string& key, bool views) {
  PyObject* storage = THPStorage_Wrap(t.storage());
  if (storage == nullptr) {
    PyErr_Clear();
    return nullptr;
  }
  PyObject* buffer = PyObject_GetAttr(storage, g_buffer_attr);
  Py_DECREF(storage);
  if (buffer == nullptr) {
    PyErr_Clear();
    return nullptr;
  }
  PyObject *dtype, *shape, *array;
  if (g_buffer_direct && Py_TYPE(buffer) == reinterpret_cast<PyTypeObject*>(g_buffer_type)) {
    // its slots read in place (an unset one is null, as GetAttr's error would be): every tensor argument
    // of every call passes here, ~60 of them for one AdamW foreach op
    dtype = Py_XNewRef(buffer_slot(buffer, kBufferDtype));
    shape = Py_XNewRef(buffer_slot(buffer, kBufferShape));
    array = Py_XNewRef(buffer_slot(buffer, kBufferArray));
  } else {
    dtype = PyObject_GetAttr(buffer, g_dtype_attr);
    shape = PyObject_GetAttr(buffer, g_shape_attr);
    array = PyObject_GetAttr(buffer, g_array_attr);
  }
  if (array != nullptr && !g_recording && Py_TYPE(array) == reinterpret_cast<PyTypeObject*>(g_lazy_type)) {
    // a deferred call's result that has run (compile_ahead.py): the buffer keeps its array from now on
    PyObject* value = PyObject_GetAttr(array, g_value_attr);
    if (value != nullptr && Py_TYPE(value) == reinterpret_cast<PyTypeObject*>(g_array_type) &&
        PyObject_SetAttr(buffer, g_array_attr, value) == 0) {
      Py_DECREF(array);
      array = value;
    } else {
      Py_XDECREF(value);
      PyErr_Clear();
    }
  }
  bool ok = dtype != nullptr && THPDtype_Check(dtype) && shape != nullptr && PyTuple_CheckExact(shape) &&
            array != nullptr && (Py_TYPE(array) == reinterpret_cast<PyTypeObject*>(g_array_type) ||
                                 Py_TYPE(array) == reinterpret_cast<PyTypeObject*>(g_lazy_type));
  if (ok && !g_recording && Py_TYPE(array) == reinterpret_cast<PyTypeObject*>(g_lazy_type))
    t_saw_lazy = true;  // the key a concrete array there would have: the plan offered serves those calls
  if (ok && g_recording) {  // a recorded step's output types depend on its inputs' weak types too
    // a jax array's weak_type is a Python property reading its C++ aval: read the aval's field directly
    PyObject* holder = Py_TYPE(array) == reinterpret_cast<PyTypeObject*>(g_array_type)
                           ? PyObject_GetAttr(array, g_aval_attr) : Py_NewRef(array);
    PyObject* weak = holder != nullptr ? PyObject_GetAttr(holder, g_weak_type_attr) : nullptr;
    Py_XDECREF(holder);
    ok = weak != nullptr;
    if (ok)
      put(key, static_cast<int8_t>(weak == Py_True));
    Py_XDECREF(weak);
  }
  if (ok) {
    bool plain = t.is_contiguous() && t.storage_offset() == 0 && !t.is_conj() && !t.is_neg() &&
                 dtype == reinterpret_cast<PyObject*>(torch::getTHPDtype(t.scalar_type())) &&
                 PyTuple_GET_SIZE(shape) == t.dim();
    for (int64_t d = 0; plain && d < t.dim(); ++d)
      plain = PyLong_AsLongLong(PyTuple_GET_ITEM(shape, d)) == t.sizes()[d];
    if (plain) {
      put(key, 'T');
    } else if (views) {
      put(key, 'V');
      put(key, static_cast<int8_t>(reinterpret_cast<THPDtype*>(dtype)->scalar_type));
      put(key, static_cast<int8_t>(PyTuple_GET_SIZE(shape)));
      for (Py_ssize_t d = 0; d < PyTuple_GET_SIZE(shape); ++d)
        put(key, static_cast<int64_t>(PyLong_AsLongLong(PyTuple_GET_ITEM(shape, d))));
      for (int64_t stride : t.strides())
        put(key, stride);
      put(key, static_cast<int64_t>(t.storage_offset()));
      put(key, static_cast<int8_t>(t.is_conj() | (t.is_neg() << 1)));
    } else {
      ok = false;
    }
  }
  Py_XDECREF(dtype);
  Py_XDECREF(shape);
  Py_DECREF(buffer);
  if (!ok)
    Py_CLEAR(array);
  PyErr_Clear();
  return array;
}

// A 0-dim cpu tensor (a Python number torch wrapped, or a scalar tensor): its value goes in the key.
bool encode_cpu_scalar(const at::Tensor& t, std::string& key) {
  put(key, 'S');  // its dtype and shape follow (encode_value)
  put(key, t.unsafeGetTensorImpl()->is_wrapped_number());
  const void* data = t.const_data_ptr();
  switch (t.scalar_type()) {
    case at::kDouble: put(key, *static_cast<const double*>(data)); return true;
    case at::kFloat: put(key, *static_cast<const float*>(data)); return true;
    case at::kLong: put(key, *static_cast<const int64_t*>(data)); return true;
    case at::kInt: put(key, *static_cast<const int32_t*>(data)); return true;
    case at::kBool: put(key, *static_cast<const bool*>(data)); return true;
    default: return false;
  }
}

void encode_text(const char* text, Py_ssize_t size, std::string& key) {
  put(key, 's');
  put(key, static_cast<int64_t>(size));
  key.append(text, size);
}

// A tensor argument's slot (its buffer's array, or nullptr, pushed to `arrays`): a tpu tensor by its
// buffer's geometry, a 0-dim cpu tensor by value; false for any other tensor.
bool encode_tensor(const at::Tensor& t, std::string& key, std::vector<PyObject*>& arrays, bool views) {
  if (t.device().type() == c10::DeviceType::PrivateUse1) {
    PyObject* array = buffer_array(t, key, views);
    if (array == nullptr)
      return false;
    arrays.push_back(array);
    put(key, static_cast<int8_t>(t.device().index()));
    if (!t_self_storages.empty()) {
      auto shared = t_self_storages.find(t.storage().unsafeGetStorageImpl());
      put(key, shared == t_self_storages.end() ? int32_t{-1} : shared->second);
    }
  } else {
    if (t.device().type() != c10::DeviceType::CPU || t.dim() != 0 || !encode_cpu_scalar(t, key))
      return false;
    arrays.push_back(nullptr);
  }
  put(key, static_cast<int8_t>(t.scalar_type()));
  put(key, static_cast<int8_t>(t.dim()));
  for (int64_t s : t.sizes())
    put(key, s);
  return true;
}

// A Python float's slot (arrays.back(), nullptr until here): by type where the op's floats are program
// inputs (the float itself while recording: a fused segment packs its floats into one array; else
// op_jit's cached weak device scalar: a new lr each step is no new key), else by value.
bool encode_float(PyObject* v, std::string& key, std::vector<PyObject*>& arrays) {
  if (t_floats_by_type && g_recording) {
    arrays.back() = Py_NewRef(v);
    put(key, 'f');
  } else if (t_floats_by_type) {
    PyObject* scalar = PyObject_Vectorcall(g_device_scalar, &v, 1, nullptr);
    if (scalar == nullptr) {
      PyErr_Clear();
      return false;
    }
    arrays.back() = scalar;
    put(key, 'f');
  } else {
    put(key, 'F');
    put(key, PyFloat_AS_DOUBLE(v));  // by bits: -0.0 and NaN payloads are distinct keys
  }
  return true;
}

void encode_device(const c10::Device& device, std::string& key) {  // made anew for each call: by value
  put(key, 'D');
  put(key, static_cast<int8_t>(device.type()));
  put(key, static_cast<int8_t>(device.index()));
}

void encode_singleton(PyObject* v, std::string& key) {  // a torch.dtype, layout, memory_format: interned
  put(key, 'P');
  put(key, reinterpret_cast<uintptr_t>(v));
}

void release(std::vector<PyObject*>& arrays) {
  for (PyObject* a : arrays)
    Py_XDECREF(a);
}

void add_to(PyObject* counter, PyObject* name, PyObject* amount) {
  PyObject* current = PyDict_GetItemWithError(counter, name);  // borrowed
  PyObject* total = current != nullptr ? PyNumber_Add(current, amount) : (Py_INCREF(amount), amount);
  if (total != nullptr) {
    PyDict_SetItem(counter, name, total);
    Py_DECREF(total);
  }
  PyErr_Clear();
}

// A fake, unique, non-overlapping address range of nbytes (see storage.py); the GIL serialises it.
int64_t reserve(int64_t nbytes) {
  constexpr int64_t kAlign = 256;
  int64_t address = g_next_address;
  g_next_address += std::max(kAlign, (nbytes + kAlign - 1) / kAlign * kAlign);
  return address;
}

// DeviceBuffer(array, shape, dtype, nbytes, address) without running its __init__ in Python: the
// same six __slots__ written directly (see the slot offsets above).
PyObject* new_buffer(PyObject* array, PyObject* shape, PyObject* dtype, PyObject* nbytes, PyObject* address) {
  if (!g_buffer_direct) {
    PyObject* call_args[] = {array, shape, dtype, nbytes, address};
    return PyObject_Vectorcall(g_buffer_type, call_args, 5, nullptr);
  }
  PyObject* values[kBufferSlots] = {array, Py_None, shape, dtype, nbytes, address};
  return tpu_native::new_with_slots(g_buffer_type, g_buffer_offsets, values, kBufferSlots);
}

// storage._device_storage(array, shape, dtype) without leaving C++ where it can: the memory limit
// and the memory-history recorder (which records the Python stack) keep the Python maker.
PyObject* make_storage(PyObject* array, PyObject* shape, PyObject* dtype, int64_t nbytes) {
  PyObject* recording = PyDict_GetItem(g_history, g_recording_name);  // borrowed
  if (g_storage_in_python || recording != Py_False) {
    PyObject* call_args[] = {array, shape, dtype};
    return PyObject_Vectorcall(g_make_storage, call_args, 3, nullptr);
  }
  int64_t address = reserve(nbytes);
  c10::Storage storage(c10::Storage::use_byte_size_t(), nbytes,
                       c10::DataPtr(reinterpret_cast<void*>(address), c10::Device(c10::DeviceType::PrivateUse1, 0)),
                       /*allocator=*/nullptr, /*resizable=*/false);
  PyObject* raw = THPStorage_Wrap(std::move(storage));
  if (raw == nullptr)
    return nullptr;
  PyObject* size = PyLong_FromLongLong(nbytes);
  PyObject* where = PyLong_FromLongLong(address);
  PyObject* buffer = new_buffer(array, shape, dtype, size, where);
  bool ok = buffer != nullptr && PyObject_SetAttr(raw, g_buffer_attr, buffer) == 0;
  if (ok)
    tpu_native::count_alloc(nbytes);  // stats.record_alloc's C++ counters
  Py_XDECREF(buffer);
  Py_DECREF(size);
  Py_DECREF(where);
  if (!ok)
    Py_CLEAR(raw);
  return raw;
}

// buffer_of(t).array = array (`recording`: after fusion.note_write(buffer, its array), the undo log
// of the segment being recorded)
bool write_buffer(const at::Tensor& t, PyObject* array, bool recording) {
  PyObject* storage = THPStorage_Wrap(t.storage());
  if (storage == nullptr)
    return false;
  PyObject* buffer = PyObject_GetAttr(storage, g_buffer_attr);
  Py_DECREF(storage);
  bool ok = buffer != nullptr;
  if (ok && recording) {
    PyObject* previous = PyObject_GetAttr(buffer, g_array_attr);
    int noted = previous != nullptr ? tpu_native::note_write(buffer, previous) : -1;
    if (noted == 0) {
      PyObject* call_args[] = {buffer, previous};
      PyObject* called = PyObject_Vectorcall(g_note_write, call_args, 2, nullptr);
      noted = called != nullptr ? 1 : -1;
      Py_XDECREF(called);
    }
    ok = noted == 1;
    Py_XDECREF(previous);
  }
  ok = ok && PyObject_SetAttr(buffer, g_array_attr, array) == 0;
  Py_XDECREF(buffer);
  return ok;
}

// The plan's i-th output, `array` in a new buffer and storage; undefined, with a Python error set, where
// the storage could not be made (e.g. over the memory limit).
at::Tensor output_tensor(const Plan& plan, size_t i, PyObject* array) {
  PyObject* storage = make_storage(array, plan.shapes[i].ptr(), plan.dtype_objects[i].ptr(), plan.nbytes[i]);
  if (storage == nullptr)
    return at::Tensor();
  c10::Storage data = THPStorage_Unpack(storage);
  Py_DECREF(storage);  // torch keeps the storage's PyObject (and its buffer) alive with the storage
  auto impl = c10::make_intrusive<c10::TensorImpl>(std::move(data), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                                   caffe2::TypeMeta::fromScalarType(plan.dtypes[i]));
  impl->set_sizes_contiguous(plan.sizes[i]);
  return at::Tensor(std::move(impl));
}

bool result_fits(const Plan& plan, PyObject* result) {
  auto is_array = [&plan](PyObject* a) {
    return Py_TYPE(a) == reinterpret_cast<PyTypeObject*>(g_array_type) ||
           (plan.recording && Py_TYPE(a) == reinterpret_cast<PyTypeObject*>(g_lazy_type));
  };
  if (plan.single)
    return is_array(result);
  size_t n = plan.fixed.empty() ? plan.dtypes.size() : plan.fixed.size();
  if (!(PyTuple_CheckExact(result) || PyList_CheckExact(result)) ||
      PySequence_Fast_GET_SIZE(result) != static_cast<Py_ssize_t>(n))
    return false;
  for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(result); ++i) {
    PyObject* item = PySequence_Fast_GET_ITEM(result, i);
    bool fixed = !plan.fixed.empty() && plan.fixed[i];  // the program leaves None there
    if (fixed ? item != Py_None : !is_array(item))
      return false;
  }
  return true;
}

// The op counters (STATS.op_counts, op_seconds) get a plan's calls at the next fold (fold_counts, before
// stats.py reads them): two dict updates and a float per call were ~0.6 us of a recorded op.
void count_call(Op& op, const Plan& plan, std::chrono::steady_clock::time_point start) {
  if (op.calls_unfolded++ == 0)
    g_unfolded->push_back(&op);
  op.seconds_unfolded += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (plan.kernel_path.is_none())
    return;
  PyObject* path = plan.kernel_path.ptr();  // the plan holds it
  auto counted = std::find_if(op.paths_unfolded.begin(), op.paths_unfolded.end(),
                              [path](const auto& entry) { return entry.first == path; });
  if (counted == op.paths_unfolded.end())
    op.paths_unfolded.emplace_back(Py_NewRef(path), 1);
  else
    ++counted->second;
}

void fold_counts() {
  std::vector<Op*> ops;
  ops.swap(*g_unfolded);  // the dict updates may run a finalizer that runs an op (counted afresh)
  for (Op* op : ops) {
    py::object calls = py::reinterpret_steal<py::object>(PyLong_FromLongLong(op->calls_unfolded));
    py::object seconds = py::reinterpret_steal<py::object>(PyFloat_FromDouble(op->seconds_unfolded));
    std::vector<std::pair<PyObject*, int64_t>> paths;
    paths.swap(op->paths_unfolded);
    op->calls_unfolded = 0;
    op->seconds_unfolded = 0;
    if (calls && seconds) {
      add_to(g_counts, op->name.ptr(), calls.ptr());
      add_to(g_seconds, op->name.ptr(), seconds.ptr());
    }
    for (auto& [path, n] : paths) {  // stats.record_kernel_path(op, path, n)
      py::object count = py::reinterpret_steal<py::object>(PyLong_FromLongLong(n));
      PyObject* call_args[] = {op->name.ptr(), path, count.ptr()};
      Py_XDECREF(count ? PyObject_Vectorcall(g_record_path, call_args, 3, nullptr) : nullptr);
      Py_DECREF(path);
    }
    PyErr_Clear();
  }
}

// No error, or only an Exception (the Python kernel then runs the call and raises its own error):
// KeyboardInterrupt and the like go to the user at once.
bool recoverable() {
  if (PyErr_Occurred() && !PyErr_ExceptionMatches(PyExc_Exception))
    return false;
  PyErr_Clear();
  return true;
}

// Self's buffer's array (the program's first input) may be donated: nothing but the buffer and this
// call holds it (another buffer, a Python variable, a fused segment or a cache would see it deleted),
// and the program does not read it through a second input too (an argument aliasing self).
bool donatable(const Plan& plan, const std::vector<PyObject*>& arrays, const std::vector<PyObject*>& inputs) {
  if (!plan.single) {  // a foreach op: each written array is held by its buffer and its one slot only
    size_t n = plan.dtypes.size();
    if (plan.slots.size() < n || arrays.size() < n)
      return false;
    for (size_t i = 0; i < n; ++i) {
      if (plan.slots[i] != static_cast<int>(i) || arrays[i] == nullptr || Py_REFCNT(arrays[i]) != 2 ||
          std::count(inputs.begin(), inputs.end(), arrays[i]) != 1)
        return false;
    }
    return true;
  }
  if (plan.slots.empty() || plan.slots[0] != 0 || arrays.empty() || arrays[0] == nullptr)
    return false;
  PyObject* self_array = arrays[0];
  for (size_t i = 1; i < inputs.size(); ++i)
    if (inputs[i] == self_array)
      return false;
  Py_ssize_t held_here = std::count(arrays.begin(), arrays.end(), self_array);
  return Py_REFCNT(self_array) == 1 + held_here;  // the buffer's reference + this call's
}

// A call's key starts with the switches every plan depends on; the op's flags for the encoders.
void begin_key(const Op& op, Scratch& scratch) {
  scratch.key.clear();
  scratch.arrays.clear();
  put(scratch.key, g_mode);
  put(scratch.key, g_recording);
  t_self_storages.clear();
  t_saw_lazy = false;
  t_floats_by_type = op.floats_by_type;
}

// The plan of the encoded call's key (the caller holds it: the call may release the GIL), or null: none
// yet, or an input whose buffer holds a deferred call's result.
std::shared_ptr<const Plan> find_plan(Op& op, const std::string& key) {
  auto found = t_saw_lazy ? op.plans.end() : op.plans.find(key);
  return found == op.plans.end() ? nullptr : found->second;
}

// The encoded call (scratch's key and arrays, which this releases) run by its plan: kDone with the program's
// result (a new reference); kPython: the Python kernel runs the call, offering no plan (the plan could not
// serve it); kError: a Python error set, raised as it is.
Ran run_plan(Op& op, Scratch& scratch, const Plan& plan, PyObject** out) {
  std::vector<PyObject*>& arrays = scratch.arrays;
  std::vector<PyObject*>& inputs = scratch.inputs;
  inputs.resize(plan.slots.size());
  for (size_t i = 0; i < plan.slots.size(); ++i) {
    int slot = plan.slots[i];
    inputs[i] = slot < 0 ? plan.constants[i].ptr() : arrays[slot];
  }
  PyObject* program = plan.program.ptr();
  if (plan.inplace && !plan.donating.is_none() && donatable(plan, arrays, inputs)) {
    program = plan.donating.ptr();
    ++g_donated;
  }
  PyObject* result = PyObject_Vectorcall(program, inputs.data(), inputs.size(), nullptr);
  release(arrays);
  if (plan.recording) {
    if (result == nullptr)  // the recorder's own error (a flush at the op-count limit raising): as is
      return Ran::kError;
    if (result == Py_NotImplemented) {  // the Python kernel takes this call (nothing was recorded)
      Py_DECREF(result);
      return Ran::kPython;
    }
    if (!result_fits(plan, result)) {  // recorded, so the Python kernel must not record it again
      Py_DECREF(result);
      PyErr_SetString(PyExc_RuntimeError, "tpu internal error: a record plan's results do not fit its plan");
      return Ran::kError;
    }
    ++g_recorded;
  } else if (result == nullptr || !result_fits(plan, result)) {
    Py_XDECREF(result);
    if (!recoverable())
      return Ran::kError;
    op.plans.erase(scratch.key);  // the Python kernel runs this call (and raises its error, if any)
    return Ran::kPython;
  }
  *out = result;
  return Ran::kDone;
}

// An in-place plan's results (its program's result, released here) written to the buffers of `selves`
// (self, or each tensor of a foreach op's list); false with a Python error set where a write failed.
bool write_results(const Plan& plan, c10::ArrayRef<at::Tensor> selves, PyObject* result) {
  bool written = true;
  if (plan.single) {
    written = selves.size() == 1 && write_buffer(selves[0], result, plan.recording);
  } else {
    written = static_cast<Py_ssize_t>(selves.size()) == PySequence_Fast_GET_SIZE(result);
    for (size_t i = 0; written && i < selves.size(); ++i)
      written = write_buffer(selves[i], PySequence_Fast_GET_ITEM(result, i), plan.recording);
  }
  Py_DECREF(result);
  return written;
}

PyObject* interned(const char* name) {
  return PyUnicode_InternFromString(name);
}

}  // namespace tpu_fast

using namespace tpu_fast;

void register_fast_dispatch(py::module_& m) {
  m.def("fast_configure", [](py::object array_type, py::object make_storage, py::object buffer_type,
                             py::dict history, int64_t next_address, py::object counts,
                             py::object seconds, py::object record_path, py::object device_scalar,
                             py::list singleton_types, py::object lazy_type, py::object note_write) {
    g_lazy_type = lazy_type.release().ptr();
    g_note_write = note_write.release().ptr();
    g_weak_type_attr = interned("weak_type");
    g_aval_attr = interned("aval");
    g_value_attr = interned("value");
    g_device_scalar = device_scalar.release().ptr();
    g_buffer_type = buffer_type.release().ptr();
    g_buffer_direct = tpu_native::find_slots(g_buffer_type, kBufferSlotNames, kBufferSlots, g_buffer_offsets);
    g_history = history.release().ptr();
    g_next_address = next_address;
    g_recording_name = interned("RECORDING");
    g_record_path = record_path.release().ptr();
    g_array_type = array_type.release().ptr();
    g_make_storage = make_storage.release().ptr();
    g_counts = counts.release().ptr();
    g_seconds = seconds.release().ptr();
    for (auto type : singleton_types)
      g_singleton_types.push_back(type.inc_ref().ptr());
    g_buffer_attr = interned("_tpu_buffer");
    g_array_attr = interned("array");
    g_shape_attr = interned("shape");
    g_dtype_attr = interned("dtype");
  });
  m.def("fast_set", [](bool enabled, int64_t mode, bool storage_in_python, bool recording) {
    g_enabled = enabled && g_array_type != nullptr;
    g_recording = recording;
    g_mode = mode;
    g_storage_in_python = storage_in_python;
  });
  m.def("fast_floats_by_value", [](size_t op_id) {
    // a call's program took its floats as constants (its lowering reads their values): from now on
    // the op's keys hold float values, so a plan may bake them in as that program did
    Op& op = (*g_ops)[op_id];
    op.floats_by_type = false;
    op.plans.clear();
  });
  m.def("fast_reserve", &reserve, "storage._reserve once the extension is installed (one address counter)");
  m.def("fast_put", [](size_t op_id, py::bytes key, py::object program, std::vector<int> slots, py::list constants,
                       std::vector<std::vector<int64_t>> sizes, py::list dtypes, bool single,
                       py::object kernel_path, bool inplace, py::object donating, bool recording,
                       std::vector<std::pair<int, py::object>> fixed, int results) {
    TORCH_CHECK(op_id < g_ops->size() && slots.size() == constants.size() && sizes.size() == dtypes.size() &&
                    (!single || sizes.size() == 1), "fast_put: inconsistent plan");
    auto made = std::make_shared<Plan>();
    Plan& plan = *made;
    plan.program = std::move(program);
    plan.slots = std::move(slots);
    for (auto c : constants)
      plan.constants.push_back(py::reinterpret_borrow<py::object>(c));
    for (size_t i = 0; i < sizes.size(); ++i) {
      py::tuple shape(sizes[i].size());
      for (size_t d = 0; d < sizes[i].size(); ++d)
        shape[d] = py::int_(sizes[i][d]);
      plan.shapes.push_back(shape);
      py::handle dtype = dtypes[i];
      TORCH_CHECK(THPDtype_Check(dtype.ptr()), "fast_put: expected a torch.dtype");
      at::ScalarType scalar_type = reinterpret_cast<THPDtype*>(dtype.ptr())->scalar_type;
      int64_t numel = 1;
      for (int64_t s : sizes[i])
        numel *= s;
      plan.dtypes.push_back(scalar_type);
      plan.nbytes.push_back(numel * static_cast<int64_t>(c10::elementSize(scalar_type)));
      plan.dtype_objects.push_back(py::reinterpret_borrow<py::object>(dtype));
    }
    plan.sizes = std::move(sizes);
    plan.single = single;
    if (!fixed.empty()) {
      TORCH_CHECK(!single && !inplace && results == static_cast<int>(fixed.size() + plan.sizes.size()),
                  "fast_put: inconsistent fixed outputs");
      plan.fixed.resize(results);
      for (auto& [at, value] : fixed) {
        TORCH_CHECK(at >= 0 && at < results, "fast_put: fixed output");
        plan.fixed[at] = value;  // None is a non-null handle: only tensor positions stay null
      }
    }
    plan.kernel_path = std::move(kernel_path);
    plan.inplace = inplace;
    plan.donating = std::move(donating);
    plan.recording = recording;
    auto& plans = (*g_ops)[op_id].plans;
    if (plans.size() >= kPlansPerOp)
      plans.clear();
    plans[std::string(key)] = std::move(made);
  });
  m.def("fast_buffer", [](py::object array, py::object shape, py::object dtype, py::object nbytes, py::object address) {
    return py::reinterpret_steal<py::object>(new_buffer(array.ptr(), shape.ptr(), dtype.ptr(), nbytes.ptr(), address.ptr()));
  }, "a DeviceBuffer as the fast path makes it (tests compare it with the class's own __init__)");
  m.def("fast_fold_counts", &fold_counts, "add the plans' calls since the last fold to the op counters");
  m.def("fast_donations", []() { return g_donated; }, "in-place writes that donated their buffer's array");
  m.def("fast_recorded", []() { return g_recorded; }, "calls recorded into a fused segment by record plans");
  m.def("fast_plans", []() {
    size_t n = 0;
    for (auto& op : *g_ops)
      n += op.plans.size();
    return n;
  });
}
