// The fast path's shared parts (fast_dispatch.cpp): plans, the call's key encoders, running a plan.
// Two front ends use them: the FastKernel object on a Python kernel's arguments (python_front.cpp), and
// the kernel torch calls, on its IValues (boxed_front.cpp).
#pragma once

#include <pybind11/pybind11.h>

#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>

#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace tpu_fast {

namespace py = pybind11;

struct Plan {
  py::object program;                 // the op's jitted program
  std::vector<int> slots;             // per program input: the argument slot of a tpu tensor, or -1
  std::vector<py::object> constants;  // per program input: the constant used where the slot is -1
  std::vector<std::vector<int64_t>> sizes;  // per output
  std::vector<py::object> shapes;     // per output, as a Python tuple (for the storage maker)
  std::vector<at::ScalarType> dtypes; // per output
  std::vector<int64_t> nbytes;        // per output
  std::vector<py::object> dtype_objects;
  bool single = true;                 // the op returns one tensor, not a tuple
  // An op whose tuple holds more than tensors (the fused attention's undefined tensors and max_q): per
  // result, the value it always is for this key (None, an int), or a null handle for the next tensor
  std::vector<py::object> fixed;
  py::object kernel_path;             // "pallas"/"xla" for ops with a Pallas variant (counted), else None
  bool inplace = false;               // the program returns self's buffer's new array (an in-place op);
                                      // with `single` false, one per tensor of self's list (_foreach_*_)
  // An in-place op: the same program donating its first input (self's buffer's array), so that XLA
  // updates the buffer in place (a slice, a scattered row) instead of copying all of it; None if not.
  py::object donating;
  // A record plan (fused mode): `program` is a fusion.Recorder, which records the call into the segment
  // and returns Lazy values (NotImplemented: the Python kernel takes the call); an in-place write is
  // noted for the segment's undo log.
  bool recording = false;
};

struct Op {
  py::object name;  // the aten op's name, the key of the op counters
  bool inplace;     // an in-place op (foo_): writes its first argument
  bool floats_by_type;
  bool list_views;  // a list's tensors may be views (foreach ops: their program reads each view)
  std::unordered_map<std::string, std::shared_ptr<const Plan>> plans;
  int64_t calls_unfolded = 0;  // plan calls and their seconds not yet added to STATS (fold_counts)
  double seconds_unfolded = 0;
  std::vector<std::pair<PyObject*, int64_t>> paths_unfolded;  // and their kernel paths (a plan's kernel_path)
};

template <typename T>
void put(std::string& key, T value) {
  key.append(reinterpret_cast<const char*>(&value), sizeof(T));
}

enum class Ran { kDone, kPython, kError };

// The per-call buffers, reused (no allocation on a warm call) unless a call is already using them.
struct Scratch {
  std::string key;
  std::vector<PyObject*> arrays;  // per argument slot: a tpu tensor's array (owned) or nullptr
  std::vector<PyObject*> inputs;
};
extern thread_local Scratch t_scratch;
extern thread_local bool t_scratch_busy;  // t_scratch is in use (a finalizer ran an op: fresh buffers)

extern bool g_enabled;  // the fast path may run (not in sync mode or NaN check)
extern std::deque<Op>* g_ops;  // every fronted op, by id (a deque: registering one never moves the others)
extern std::vector<PyObject*> g_singleton_types;  // torch.dtype, torch.layout, torch.memory_format
// An in-place call's self storages and their positions (encode_tensor keys the aliasing of each tensor)
extern thread_local std::unordered_map<const c10::StorageImpl*, int32_t> t_self_storages;

void begin_key(const Op& op, Scratch& scratch);
bool encode_tensor(const at::Tensor& t, std::string& key, std::vector<PyObject*>& arrays, bool views);
bool encode_float(PyObject* v, std::string& key, std::vector<PyObject*>& arrays);
void encode_text(const char* text, Py_ssize_t size, std::string& key);
void encode_device(const c10::Device& device, std::string& key);
void encode_singleton(PyObject* v, std::string& key);
// The Python front's encoding of a call (torch's args tuple and kwargs dict); false: not eligible
bool encode_call(const Op& op, PyObject* args, PyObject* kwargs, Scratch& scratch);
void release(std::vector<PyObject*>& arrays);
bool recoverable();

std::shared_ptr<const Plan> find_plan(Op& op, const std::string& key);
Ran run_plan(Op& op, Scratch& scratch, const Plan& plan, PyObject** out);
bool write_results(const Plan& plan, c10::ArrayRef<at::Tensor> selves, PyObject* result);
at::Tensor output_tensor(const Plan& plan, size_t i, PyObject* array);
void count_call(Op& op, const Plan& plan, std::chrono::steady_clock::time_point start);

// A FastKernel's op (nullptr for any other object), and its Python kernel run without a plan offered
// (as the kernel does where the C++ path declines a call it had a plan for)
Op* kernel_op(PyObject* kernel);
PyObject* call_python_kernel(PyObject* kernel, PyObject* args, PyObject* kwargs);

}  // namespace tpu_fast
