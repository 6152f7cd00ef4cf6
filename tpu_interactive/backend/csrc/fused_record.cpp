// Fused mode's recording of a call that a C++ record plan serves (fusion.py is its Python half).
//
// A record plan (fast_dispatch.cpp) skips dispatch's Python, but each hit still called fusion.Recorder,
// which found the segment (_segment) and appended the step to it (Segment.add) in Python: ~12% of a fused
// training step of a small block, ~5-9 us a recorded op. A FusedRecorder does the same appends from C++:
// the step's input references (a value recorded earlier in the segment by position; an outside array or
// float as the segment's next outside input), its results as fusion.Lazy values, the (step, keys, refs,
// op name, user's line) entry and the segment's key. It hands the call to the Python Recorder whenever
// anything is unusual: no segment yet or autograd's backward beginning (both flush or start one, and only
// there may an unrecorded stretch start: unrecorded.py), an input whose segment failed or whose deferred
// call has not run.
// The two must record alike (a segment's program is cached by what they append): tests record one step
// each way and compare the segments.
#include <pybind11/pybind11.h>
#include <structmember.h>

#include <torch/csrc/autograd/graph_task.h>

#include <algorithm>
#include <cstddef>

namespace py = pybind11;

namespace tpu_native {
bool find_slots(PyObject* type, const char* const* names, int n, Py_ssize_t* offsets);  // fast_dispatch.cpp
PyObject* new_with_slots(PyObject* type, const Py_ssize_t* offsets, PyObject* const* values, int n);
py::object user_site(int skip, py::handle classify);  // tpu_native.cpp
}  // namespace tpu_native

namespace {

enum LazySlot { kPos, kShape, kDtype, kWeak, kValue, kError, kProducer, kLazySlots };
const char* const kLazySlotNames[kLazySlots] = {"pos", "shape", "dtype", "weak_type", "value", "error", "producer"};
Py_ssize_t g_lazy_offsets[kLazySlots];
PyObject* g_lazy = nullptr;       // fusion.Lazy; null (every call to the Python recorder) if its slots differ
PyObject* g_current = nullptr;    // fusion._current: [the segment being recorded, or None]
PyObject* g_flush = nullptr;      // fusion.flush(reason)
Py_ssize_t g_max_ops = 0, g_max_depth = 0;  // config.fuse_max_ops, fuse_max_depth (fused_limits)
PyObject* g_classify = nullptr;   // errors.is_internal (for the user's line)
PyObject* g_float_type = reinterpret_cast<PyObject*>(&PyFloat_Type);
int64_t g_recorded_here = 0;      // calls recorded without the Python recorder

enum Name { kValues, kDepth, kSteps, kKey, kExt, kExtAvals, kExtIds, kTask, kUndo, kShapeName, kDtypeName, kWeakName,
            kUnflatten, kAvalName, kNames };
const char* const kNameTexts[kNames] = {"values", "depth", "steps", "key", "ext", "ext_avals", "_ext_ids", "task",
                                        "undo", "shape", "dtype", "weak_type", "unflatten", "aval"};
PyObject* g_names[kNames];

inline PyObject* lazy_slot(PyObject* lazy, int slot) {  // borrowed
  return *reinterpret_cast<PyObject**>(reinterpret_cast<char*>(lazy) + g_lazy_offsets[slot]);
}

inline bool is_lazy(PyObject* v) {
  return reinterpret_cast<PyObject*>(Py_TYPE(v)) == g_lazy;
}

struct FusedRecorder {
  PyObject_HEAD
  vectorcallfunc vectorcall;
  PyObject* python;   // the fusion.Recorder: it takes the calls this one does not
  PyObject* step;     // recorded_step.Step
  PyObject* op_name;
  PyObject* step_id;
  PyObject* treedef;  // the results' tree (None: one array)
  PyObject* avals;    // a tuple of (shape, dtype, weak_type) per result
};

// The recording's temporaries: new references (or null after an error), released when they go out of scope.
inline py::object steal(PyObject* owned) {
  return py::reinterpret_steal<py::object>(owned);
}

// The segment's outside input for array or float v (Segment._ref for those): its negative reference.
PyObject* outside_ref(PyObject* seg_ext, PyObject* ext_avals, PyObject* ext_ids, PyObject* v) {
  if (PyFloat_CheckExact(v)) {  // every float is an input of its own (a learning rate, a step count)
    if (PyList_Append(seg_ext, v) < 0 || PyList_Append(ext_avals, g_float_type) < 0)
      return nullptr;
    return PyLong_FromSsize_t(-PyList_GET_SIZE(seg_ext));
  }
  py::object id = steal(PyLong_FromVoidPtr(v));
  if (!id)
    return nullptr;
  PyObject* index = PyDict_GetItemWithError(ext_ids, id.ptr());  // borrowed
  if (index != nullptr)
    return PyNumber_Negative(index);
  if (PyErr_Occurred())
    return nullptr;
  // a jax array's aval is C++'s and holds its shape, dtype and weak type as plain attributes (the array's
  // own attributes are Python properties that read it: three Python calls)
  py::object described = steal(PyObject_GetAttr(v, g_names[kAvalName]));
  if (!described) {
    if (!PyErr_ExceptionMatches(PyExc_AttributeError))
      return nullptr;
    PyErr_Clear();
    described = py::reinterpret_borrow<py::object>(v);
  }
  py::object shape = steal(PyObject_GetAttr(described.ptr(), g_names[kShapeName]));
  py::object dtype = steal(shape ? PyObject_GetAttr(described.ptr(), g_names[kDtypeName]) : nullptr);
  if (!dtype)
    return nullptr;
  py::object weak = steal(PyObject_GetAttr(described.ptr(), g_names[kWeakName]));
  if (!weak) {
    if (!PyErr_ExceptionMatches(PyExc_AttributeError))
      return nullptr;
    PyErr_Clear();
    weak = py::reinterpret_borrow<py::object>(Py_False);
  }
  py::object aval = steal(PyTuple_Pack(3, shape.ptr(), dtype.ptr(), weak.ptr()));
  if (!aval || PyList_Append(seg_ext, v) < 0 || PyList_Append(ext_avals, aval.ptr()) < 0)
    return nullptr;
  py::object position = steal(PyLong_FromSsize_t(PyList_GET_SIZE(seg_ext)));
  if (!position || PyDict_SetItem(ext_ids, id.ptr(), position.ptr()) < 0)
    return nullptr;
  return PyLong_FromSsize_t(-PyList_GET_SIZE(seg_ext));
}

// Segment.add(step, inputs, op_name, None) for a step without random keys, on segment `seg`.
PyObject* add(FusedRecorder* self, PyObject* seg, PyObject* const* inputs, Py_ssize_t n) {
  py::object values = steal(PyObject_GetAttr(seg, g_names[kValues]));
  py::object depth = steal(PyObject_GetAttr(seg, g_names[kDepth]));
  py::object steps = steal(PyObject_GetAttr(seg, g_names[kSteps]));
  py::object key = steal(PyObject_GetAttr(seg, g_names[kKey]));
  py::object ext = steal(PyObject_GetAttr(seg, g_names[kExt]));
  py::object ext_avals = steal(PyObject_GetAttr(seg, g_names[kExtAvals]));
  py::object ext_ids = steal(PyObject_GetAttr(seg, g_names[kExtIds]));
  if (!values || !depth || !steps || !key || !ext || !ext_avals || !ext_ids)
    return nullptr;
  if (!PyList_CheckExact(values.ptr()) || !PyList_CheckExact(depth.ptr()) || !PyList_CheckExact(steps.ptr()) ||
      !PyList_CheckExact(key.ptr()) || !PyList_CheckExact(ext.ptr()) || !PyList_CheckExact(ext_avals.ptr()) ||
      !PyDict_CheckExact(ext_ids.ptr())) {
    PyErr_SetString(PyExc_RuntimeError, "tpu internal error: a fused segment's lists are not lists");
    return nullptr;
  }
  py::object refs = steal(PyTuple_New(n));
  if (!refs)
    return nullptr;
  Py_ssize_t chain = 0;
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* v = inputs[i];
    PyObject* ref;
    if (is_lazy(v) && lazy_slot(v, kValue) != Py_None)
      v = lazy_slot(v, kValue);  // computed already (by an earlier segment): an outside array
    if (is_lazy(v)) {  // pending: recorded earlier in this segment (the caller sent the others to Python)
      ref = Py_NewRef(lazy_slot(v, kPos));
      Py_ssize_t at = PyLong_AsSsize_t(ref);
      if (at < 0 || at >= PyList_GET_SIZE(depth.ptr())) {
        Py_DECREF(ref);
        if (!PyErr_Occurred())
          PyErr_SetString(PyExc_RuntimeError, "tpu internal error: a recorded value is not in its segment");
        return nullptr;
      }
      chain = std::max(chain, PyLong_AsSsize_t(PyList_GET_ITEM(depth.ptr(), at)));  // the longest chain of steps
    } else {
      ref = outside_ref(ext.ptr(), ext_avals.ptr(), ext_ids.ptr(), v);
    }
    if (ref == nullptr)
      return nullptr;
    PyTuple_SET_ITEM(refs.ptr(), i, ref);
  }
  ++chain;
  py::object chain_obj = steal(PyLong_FromSsize_t(chain));
  Py_ssize_t base = PyList_GET_SIZE(values.ptr());
  Py_ssize_t results = PyTuple_GET_SIZE(self->avals);
  py::object outs = steal(PyList_New(results));
  if (!chain_obj || !outs)
    return nullptr;
  for (Py_ssize_t i = 0; i < results; ++i) {
    PyObject* aval = PyTuple_GET_ITEM(self->avals, i);
    py::object pos = steal(PyLong_FromSsize_t(base + i));
    if (!pos)
      return nullptr;
    PyObject* slots[kLazySlots] = {pos.ptr(), PyTuple_GET_ITEM(aval, 0), PyTuple_GET_ITEM(aval, 1),
                                   PyTuple_GET_ITEM(aval, 2), Py_None, Py_None, Py_None};
    PyObject* lazy = tpu_native::new_with_slots(g_lazy, g_lazy_offsets, slots, kLazySlots);
    if (lazy == nullptr)
      return nullptr;
    PyList_SET_ITEM(outs.ptr(), i, lazy);
    if (PyList_Append(values.ptr(), lazy) < 0 || PyList_Append(depth.ptr(), chain_obj.ptr()) < 0)
      return nullptr;
  }
  py::object site;
  try {
    site = tpu_native::user_site(0, g_classify);
  } catch (py::error_already_set& err) {
    err.restore();
    return nullptr;
  }
  PyObject* no_keys = PyTuple_New(0);  // the empty tuple (a singleton)
  py::object entry = steal(PyTuple_Pack(5, self->step, no_keys, refs.ptr(), self->op_name, site.ptr()));
  py::object key_entry = steal(PyTuple_Pack(3, self->step_id, no_keys, refs.ptr()));
  Py_DECREF(no_keys);
  if (!entry || !key_entry || PyList_Append(steps.ptr(), entry.ptr()) < 0 ||
      PyList_Append(key.ptr(), key_entry.ptr()) < 0)
    return nullptr;
  if (PyList_GET_SIZE(steps.ptr()) >= g_max_ops || chain >= g_max_depth) {
    const char* why = chain < g_max_depth ? "op-count limit" : "dependency-chain limit";
    py::object reason = steal(PyUnicode_FromString(why));
    py::object done = steal(reason ? PyObject_CallOneArg(g_flush, reason.ptr()) : nullptr);
    if (!done)
      return nullptr;
  }
  ++g_recorded_here;
  if (self->treedef == Py_None)
    return Py_NewRef(PyList_GET_ITEM(outs.ptr(), 0));
  return PyObject_CallMethodOneArg(self->treedef, g_names[kUnflatten], outs.ptr());
}

// fusion.Recorder.__call__ from C++ (the Python recorder where the call is unusual, see the top).
PyObject* record(PyObject* self_, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
  auto* self = reinterpret_cast<FusedRecorder*>(self_);
  Py_ssize_t n = PyVectorcall_NARGS(nargsf);
  bool usual = g_lazy != nullptr && kwnames == nullptr;
  for (Py_ssize_t i = 0; usual && i < n; ++i) {  // a Lazy input is computed, or pending in the segment being recorded
    if (!is_lazy(args[i]))
      continue;
    PyObject* value = lazy_slot(args[i], kValue);
    usual = value != nullptr &&
            (value != Py_None || (lazy_slot(args[i], kProducer) == Py_None && lazy_slot(args[i], kError) == Py_None));
  }
  PyObject* seg = usual ? PyList_GET_ITEM(g_current, 0) : nullptr;  // borrowed
  if (seg == nullptr || seg == Py_None)
    return PyObject_Vectorcall(self->python, args, nargsf, kwnames);
  py::object task_obj = steal(PyObject_GetAttr(seg, g_names[kTask]));
  if (!task_obj)
    return nullptr;
  long long seg_task = PyLong_AsLongLong(task_obj.ptr());
  long long task = torch::autograd::get_current_graph_task_id();  // -1 outside autograd's backward
  if (task != seg_task) {
    if (task >= 0)  // autograd's backward begins (the forward runs now), or another graph task's
      return PyObject_Vectorcall(self->python, args, nargsf, kwnames);
    py::object value = steal(PyLong_FromLongLong(task));
    if (!value || PyObject_SetAttr(seg, g_names[kTask], value.ptr()) < 0)
      return nullptr;
  }
  Py_INCREF(seg);  // a flush at the op-count limit replaces the current segment
  PyObject* out = add(self, seg, args, n);
  Py_DECREF(seg);
  return out;
}

void recorder_dealloc(PyObject* self_) {
  auto* self = reinterpret_cast<FusedRecorder*>(self_);
  Py_XDECREF(self->python);
  Py_XDECREF(self->step);
  Py_XDECREF(self->op_name);
  Py_XDECREF(self->step_id);
  Py_XDECREF(self->treedef);
  Py_XDECREF(self->avals);
  Py_TYPE(self_)->tp_free(self_);
}

PyObject* recorder_python(PyObject* self_, void*) {
  return Py_NewRef(reinterpret_cast<FusedRecorder*>(self_)->python);
}

PyGetSetDef g_recorder_getset[] = {
    {"python", recorder_python, nullptr, "the fusion.Recorder this one stands for", nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr}};

PyTypeObject g_recorder_type = [] {
  PyTypeObject type{PyVarObject_HEAD_INIT(nullptr, 0)};
  type.tp_name = "tpu_interactive_native.FusedRecorder";
  type.tp_basicsize = sizeof(FusedRecorder);
  type.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL;
  type.tp_vectorcall_offset = offsetof(FusedRecorder, vectorcall);
  type.tp_call = PyVectorcall_Call;
  type.tp_dealloc = recorder_dealloc;
  type.tp_getset = g_recorder_getset;
  type.tp_doc = "fusion.Recorder's call from C++ (see fused_record.cpp)";
  return type;
}();

}  // namespace

namespace tpu_native {

// fusion.note_write(buffer, previous) for a record plan's in-place write (AdamW's foreach ops write ~100
// buffers a step): the segment's undo log gets (weakref to buffer, previous array or pending position,
// steps recorded so far). 1: noted (or no segment), 0: not configured (the caller calls Python), -1: error.
int note_write(PyObject* buffer, PyObject* previous) {
  if (g_lazy == nullptr)
    return 0;
  PyObject* seg = PyList_GET_ITEM(g_current, 0);  // borrowed
  if (seg == Py_None)
    return 1;
  py::object undo = steal(PyObject_GetAttr(seg, g_names[kUndo]));
  py::object steps = steal(PyObject_GetAttr(seg, g_names[kSteps]));
  if (!undo || !steps || !PyList_CheckExact(steps.ptr()))
    return -1;
  if (is_lazy(previous) && lazy_slot(previous, kValue) == Py_None)
    previous = lazy_slot(previous, kPos);  // a position, not the object: a saved Lazy would count as live
  py::object ref = steal(PyWeakref_NewRef(buffer, nullptr));
  py::object count = steal(PyLong_FromSsize_t(PyList_GET_SIZE(steps.ptr())));
  py::object entry = steal(ref && count ? PyTuple_Pack(3, ref.ptr(), previous, count.ptr()) : nullptr);
  return entry && PyList_Append(undo.ptr(), entry.ptr()) == 0 ? 1 : -1;
}

}  // namespace tpu_native

void register_fused_record(py::module_& m) {
  TORCH_CHECK(PyType_Ready(&g_recorder_type) == 0, "FusedRecorder type");
  m.def("fused_configure", [](py::object lazy_type, py::list current, py::object flush, py::object classify) {
    for (int i = 0; i < kNames; ++i)
      g_names[i] = PyUnicode_InternFromString(kNameTexts[i]);
    g_current = current.release().ptr();
    g_flush = flush.release().ptr();
    g_classify = classify.release().ptr();
    PyObject* lazy = lazy_type.release().ptr();
    g_lazy = tpu_native::find_slots(lazy, kLazySlotNames, kLazySlots, g_lazy_offsets) ? lazy : nullptr;
    return g_lazy != nullptr;
  }, "hand the C++ recorder fusion's state; False if fusion.Lazy's slots are not as it expects");
  m.def("fused_recorder", [](py::object recorder) {
    py::object step = recorder.attr("step");
    py::tuple avals(py::len(step.attr("avals")));
    size_t i = 0;
    for (auto aval : step.attr("avals")) {
      py::tuple entry = py::reinterpret_borrow<py::tuple>(aval);
      TORCH_CHECK(entry.size() == 3, "fused_recorder: an aval is (shape, dtype, weak_type)");
      avals[i++] = entry;
    }
    TORCH_CHECK(i > 0 && py::int_(step.attr("n_keys")).cast<int>() == 0,
                "fused_recorder: a step with results, no keys");
    auto* made = PyObject_New(FusedRecorder, &g_recorder_type);
    TORCH_CHECK(made != nullptr, "fused_recorder");
    made->vectorcall = record;
    made->python = recorder.inc_ref().ptr();
    made->step = step.inc_ref().ptr();
    made->op_name = py::object(recorder.attr("op_name")).release().ptr();
    made->step_id = py::object(step.attr("id")).release().ptr();
    made->treedef = (step.attr("single").cast<bool>() ? py::none() : py::object(step.attr("treedef"))).release().ptr();
    made->avals = avals.release().ptr();
    return py::reinterpret_steal<py::object>(reinterpret_cast<PyObject*>(made));
  }, "a fusion.Recorder's C++ twin (what a record plan calls)");
  m.def("fused_limits", [](Py_ssize_t max_ops, Py_ssize_t max_depth) {
    g_max_ops = max_ops;
    g_max_depth = max_depth;
  }, "config.fuse_max_ops and fuse_max_depth (fast_path.refresh hands them over at every config change)");
  m.def("fused_recorded_here", []() { return g_recorded_here; }, "calls recorded without the Python recorder");
}
