// The Python front end of the fast path: the FastKernel object fast_path.front makes for each op. It keys
// a call from the Python arguments a Python kernel gets (torch's args tuple and kwargs dict), runs its plan
// (fast_dispatch.cpp) and returns Python tensors; on a miss it runs the Python kernel with the key pending,
// for the plan to be offered. boxed_front.cpp, the kernel torch calls, hands it the calls it does not serve.
#include "fast_dispatch.h"

#include <torch/csrc/Device.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/Storage.h>
#include <torch/csrc/autograd/python_variable.h>

#include <chrono>
#include <string>
#include <vector>

namespace tpu_fast {
namespace {

PyObject* g_written = nullptr;  // returned by a hit of an in-place foreach plan: the kernel returns None

bool encode_text(PyObject* v, std::string& key) {
  Py_ssize_t size = 0;
  const char* text = PyUnicode_AsUTF8AndSize(v, &size);
  if (text == nullptr) {
    PyErr_Clear();
    return false;
  }
  tpu_fast::encode_text(text, size, key);
  return true;
}

// Appends one argument slot to the key (and its array, or nullptr, to `arrays`); false when the
// value makes the call not eligible. `views`: a tpu tensor may be a view of its buffer.
bool encode_value(PyObject* v, std::string& key, std::vector<PyObject*>& arrays, bool views) {
  if (THPVariable_CheckExact(v))
    return encode_tensor(THPVariable_Unpack(v), key, arrays, views);
  arrays.push_back(nullptr);
  if (v == Py_None) {
    put(key, 'N');
  } else if (PyBool_Check(v)) {
    put(key, 'B');
    put(key, v == Py_True);
  } else if (PyLong_CheckExact(v)) {
    int overflow = 0;
    long long value = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (overflow != 0 || (value == -1 && PyErr_Occurred())) {
      PyErr_Clear();
      return false;
    }
    put(key, 'I');
    put(key, static_cast<int64_t>(value));
  } else if (PyFloat_CheckExact(v)) {
    return encode_float(v, key, arrays);
  } else if (PyUnicode_CheckExact(v)) {
    return encode_text(v, key);
  } else if (THPDevice_Check(v)) {  // _to_copy(device=...)
    encode_device(reinterpret_cast<THPDevice*>(v)->device, key);
  } else {
    for (PyObject* type : g_singleton_types) {
      if (Py_TYPE(v) == reinterpret_cast<PyTypeObject*>(type)) {
        encode_singleton(v, key);
        return true;
      }
    }
    return false;
  }
  return true;
}

// A top-level argument: a list/tuple is flattened into one slot per item (one level deep); its items
// may be views where `list_views` allows them.
bool encode_argument(PyObject* v, std::string& key, std::vector<PyObject*>& arrays, bool list_views) {
  if (PyList_CheckExact(v) || PyTuple_CheckExact(v)) {
    PyObject* seq = v;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    put(key, PyList_CheckExact(v) ? 'L' : 'U');
    put(key, static_cast<int64_t>(n));
    PyObject** items = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t i = 0; i < n; ++i) {
      if (PyList_CheckExact(items[i]) || PyTuple_CheckExact(items[i]) || !encode_value(items[i], key, arrays, list_views))
        return false;
    }
    return true;
  }
  return encode_value(v, key, arrays, true);  // a view only as a whole argument (planned.run)
}

// The plan's outputs as tpu tensors: a new reference, or nullptr with a Python error set.
PyObject* wrap_outputs(const Plan& plan, PyObject* result) {
  Py_ssize_t n = static_cast<Py_ssize_t>(plan.fixed.empty() ? plan.dtypes.size() : plan.fixed.size());
  PyObject* out = plan.single ? nullptr : PyTuple_New(n);
  for (Py_ssize_t at = 0, i = 0; at < n; ++at) {
    if (!plan.fixed.empty() && plan.fixed[at]) {
      PyTuple_SET_ITEM(out, at, plan.fixed[at].inc_ref().ptr());
      continue;
    }
    at::Tensor made = output_tensor(plan, i, plan.single ? result : PySequence_Fast_GET_ITEM(result, at));
    if (!made.defined()) {
      Py_XDECREF(out);
      return nullptr;
    }
    PyObject* tensor = THPVariable_Wrap(std::move(made));
    if (plan.single)
      return tensor;
    PyTuple_SET_ITEM(out, at, tensor);
    ++i;
  }
  return out;
}

}  // namespace

bool encode_call(const Op& op, PyObject* args, PyObject* kwargs, Scratch& scratch) {
  begin_key(op, scratch);
  bool eligible = PyTuple_CheckExact(args);
  if (op.inplace) {  // the first argument is self: a tpu tensor, or a foreach op's list
    eligible = eligible && PyTuple_GET_SIZE(args) > 0;
    if (eligible) {
      PyObject* self = PyTuple_GET_ITEM(args, 0);
      if (THPVariable_CheckExact(self)) {
        t_self_storages.emplace(THPVariable_Unpack(self).storage().unsafeGetStorageImpl(), 0);
      } else if (PyList_CheckExact(self) || PyTuple_CheckExact(self)) {
        for (Py_ssize_t i = 0; eligible && i < PySequence_Fast_GET_SIZE(self); ++i) {
          PyObject* item = PySequence_Fast_GET_ITEM(self, i);
          eligible = THPVariable_CheckExact(item);
          if (eligible)
            t_self_storages.emplace(THPVariable_Unpack(item).storage().unsafeGetStorageImpl(), static_cast<int32_t>(i));
        }
      } else {
        eligible = false;
      }
    }
  }
  for (Py_ssize_t i = 0; eligible && i < PyTuple_GET_SIZE(args); ++i)
    // an in-place op's written list stays plain: its plan writes each buffer's whole array
    eligible = encode_argument(PyTuple_GET_ITEM(args, i), scratch.key, scratch.arrays, op.list_views && !(op.inplace && i == 0));
  if (eligible && kwargs != nullptr) {
    eligible = PyDict_CheckExact(kwargs);
    PyObject *name, *value;
    Py_ssize_t pos = 0;
    while (eligible && PyDict_Next(kwargs, &pos, &name, &value)) {
      eligible = PyUnicode_CheckExact(name) && encode_text(name, scratch.key) &&
                 encode_argument(value, scratch.key, scratch.arrays, op.list_views);
    }
  }
  t_self_storages.clear();
  if (!eligible)
    release(scratch.arrays);
  return eligible;
}

namespace {

PyObject* fast_call_with(Op& op, PyObject* args, PyObject* kwargs, Scratch& scratch) {
  auto start = std::chrono::steady_clock::now();
  if (!encode_call(op, args, kwargs, scratch))
    Py_RETURN_NONE;
  PyObject* self = op.inplace ? PyTuple_GET_ITEM(args, 0) : nullptr;
  std::shared_ptr<const Plan> held = find_plan(op, scratch.key);
  if (held == nullptr) {  // the Python kernel runs and offers a plan for this key
    release(scratch.arrays);
    return PyBytes_FromStringAndSize(scratch.key.data(), static_cast<Py_ssize_t>(scratch.key.size()));
  }
  PyObject* result = nullptr;
  switch (run_plan(op, scratch, *held, &result)) {
    case Ran::kPython:
      Py_RETURN_NONE;
    case Ran::kError:
      return nullptr;
    case Ran::kDone:
      break;
  }
  const Plan& plan = *held;
  if (plan.inplace && !plan.single) {  // a foreach op: each tensor of self's list gets its new array
    std::vector<at::Tensor> selves;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(self); ++i)
      selves.push_back(THPVariable_Unpack(PySequence_Fast_GET_ITEM(self, i)));
    if (!write_results(plan, selves, result))  // not reached for a plan that fits: an error here is the attribute write's own
      return nullptr;
    count_call(op, plan, start);
    return Py_NewRef(g_written);
  }
  if (plan.inplace) {  // self's buffer holds the new array: every alias sees it
    if (!write_results(plan, THPVariable_Unpack(self), result))
      return recoverable() && !plan.recording ? Py_NewRef(Py_None) : nullptr;
    count_call(op, plan, start);
    return Py_NewRef(self);
  }
  PyObject* out = wrap_outputs(plan, result);
  Py_DECREF(result);
  if (out == nullptr) {  // e.g. over the memory limit: the Python kernel raises it, annotated
    if (!recoverable())
      return nullptr;
    Py_RETURN_NONE;
  }
  count_call(op, plan, start);
  return out;
}

// One call from its plan: the result (a hit), the call's key as bytes (a miss: the Python kernel
// runs, then offers its plan), None (not eligible), or nullptr with a Python error set.
PyObject* fast_call(Op& op, PyObject* args, PyObject* kwargs) {
  if (!g_enabled)
    Py_RETURN_NONE;
  if (t_scratch_busy) {  // re-entered (a finalizer ran an op): fresh buffers
    Scratch scratch;
    return fast_call_with(op, args, kwargs, scratch);
  }
  t_scratch_busy = true;
  PyObject* out = fast_call_with(op, args, kwargs, t_scratch);
  t_scratch_busy = false;
  return out;
}

// The PrivateUse1 kernel torch calls (through torch.library, as it calls any Python kernel): a hit
// returns from C++; a miss runs the Python kernel with (lowering, op id, key) in fast_path.PENDING.
struct FastKernel {
  PyObject_HEAD
  Op* op;
  PyObject* slow;     // the Python kernel
  PyObject* token;    // (lowering, op id): PENDING[0] is token + (key,) during a miss
  PyObject* pending;  // fast_path.PENDING (a list of one item)
};

// The Python kernel with PENDING[0] = `pending` (stolen): its plan offered for that key, or none (None)
PyObject* run_python_kernel(FastKernel* self, PyObject* pending, PyObject* args, PyObject* kwargs) {
  PyList_SetItem(self->pending, 0, pending);  // steals
  PyObject* out = PyObject_Call(self->slow, args, kwargs);
  PyList_SetItem(self->pending, 0, Py_NewRef(Py_None));  // leaves a raised error as it is
  return out;
}

PyObject* kernel_call(PyObject* self_, PyObject* args, PyObject* kwargs) {
  auto* self = reinterpret_cast<FastKernel*>(self_);
  PyObject* result = fast_call(*self->op, args, kwargs);
  if (result == g_written) {
    Py_DECREF(result);
    Py_RETURN_NONE;
  }
  if (result == nullptr || (result != Py_None && !PyBytes_CheckExact(result)))
    return result;
  PyObject* pending = Py_None;
  if (result != Py_None) {
    pending = PyTuple_Pack(3, PyTuple_GET_ITEM(self->token, 0), PyTuple_GET_ITEM(self->token, 1), result);
    if (pending == nullptr) {
      Py_DECREF(result);
      return nullptr;
    }
  } else {
    Py_INCREF(pending);
  }
  Py_DECREF(result);
  return run_python_kernel(self, pending, args, kwargs);
}

void kernel_dealloc(PyObject* self_) {
  auto* self = reinterpret_cast<FastKernel*>(self_);
  Py_XDECREF(self->slow);
  Py_XDECREF(self->token);
  Py_XDECREF(self->pending);
  Py_TYPE(self_)->tp_free(self_);
}

PyTypeObject g_kernel_type = [] {
  PyTypeObject type{PyVarObject_HEAD_INIT(nullptr, 0)};
  type.tp_name = "tpu_interactive_native.FastKernel";
  type.tp_basicsize = sizeof(FastKernel);
  type.tp_flags = Py_TPFLAGS_DEFAULT;
  type.tp_call = kernel_call;
  type.tp_dealloc = kernel_dealloc;
  type.tp_doc = "a tpu kernel behind the C++ fast path (see fast_path.py)";
  return type;
}();

}  // namespace

Op* kernel_op(PyObject* kernel) {
  return Py_TYPE(kernel) == &g_kernel_type ? reinterpret_cast<FastKernel*>(kernel)->op : nullptr;
}

PyObject* call_python_kernel(PyObject* kernel, PyObject* args, PyObject* kwargs) {
  return run_python_kernel(reinterpret_cast<FastKernel*>(kernel), Py_NewRef(Py_None), args, kwargs);
}

}  // namespace tpu_fast

using namespace tpu_fast;

void register_python_front(py::module_& m) {
  TORCH_CHECK(PyType_Ready(&g_kernel_type) == 0, "FastKernel type");
  g_written = PyObject_CallNoArgs(reinterpret_cast<PyObject*>(&PyBaseObject_Type));
  m.def("fast_kernel", [](py::object name, py::object slow, py::object low, py::list pending, bool inplace,
                          bool floats_by_type, bool list_views) {
    g_ops->push_back(Op{std::move(name), inplace, floats_by_type, list_views, {}});
    auto* kernel = PyObject_New(FastKernel, &g_kernel_type);
    TORCH_CHECK(kernel != nullptr, "fast_kernel");
    kernel->op = &g_ops->back();
    kernel->slow = slow.release().ptr();
    kernel->token = py::make_tuple(low, g_ops->size() - 1).release().ptr();
    kernel->pending = pending.release().ptr();
    return py::reinterpret_steal<py::object>(reinterpret_cast<PyObject*>(kernel));
  });
}
