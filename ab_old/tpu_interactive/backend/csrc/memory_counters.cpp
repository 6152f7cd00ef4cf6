// The buffer counters' allocations and frees, counted in C++ (stats.py folds them into its counters).
//
// stats.record_alloc ran in Python for every output the fast path made: a lock, the pending frees folded,
// six counters and two peaks, ~1.4 us of a recorded op's ~14 us in a fused training step. Here an
// allocation or a free is a few additions under the GIL, which no garbage collection can interrupt (the
// Python counters need their lock and a queue of frees for that). What stats.py needs to fold them in
// order: the net change since its last fold and the highest the running total reached at an allocation
// (the peak is live bytes then plus that), and the totals of allocations and frees.
#include <Python.h>

#include <algorithm>
#include <cstdint>

namespace {

struct Counted {
  int64_t net_bytes = 0, top_bytes = 0, net_buffers = 0, top_buffers = 0;
  int64_t allocated_bytes = 0, allocations = 0, freed_bytes = 0, frees = 0;
};
Counted g_counted;  // since stats.py's last fold; the GIL serialises every update

}  // namespace

namespace tpu_native {

void count_alloc(int64_t nbytes) {  // memory_alloc, for the fast path's outputs too
  Counted& c = g_counted;
  c.net_bytes += nbytes;
  c.net_buffers += 1;
  c.top_bytes = std::max(c.top_bytes, c.net_bytes);
  c.top_buffers = std::max(c.top_buffers, c.net_buffers);
  c.allocated_bytes += nbytes;
  c.allocations += 1;
}

}  // namespace tpu_native

namespace {

PyObject* memory_alloc(PyObject*, PyObject* nbytes) {
  int64_t n = PyLong_AsLongLong(nbytes);
  if (n == -1 && PyErr_Occurred())
    return nullptr;
  tpu_native::count_alloc(n);
  Py_RETURN_NONE;
}

PyObject* memory_free(PyObject*, PyObject* nbytes) {
  int64_t n = PyLong_AsLongLong(nbytes);
  if (n == -1 && PyErr_Occurred())
    return nullptr;
  Counted& c = g_counted;
  c.net_bytes -= n;
  c.net_buffers -= 1;
  c.freed_bytes += n;
  c.frees += 1;
  Py_RETURN_NONE;
}

PyObject* memory_take(PyObject*, PyObject*) {
  Counted c = g_counted;
  g_counted = Counted();
  return Py_BuildValue("(LLLLLLLL)", static_cast<long long>(c.net_bytes), static_cast<long long>(c.top_bytes),
                       static_cast<long long>(c.net_buffers), static_cast<long long>(c.top_buffers),
                       static_cast<long long>(c.allocated_bytes), static_cast<long long>(c.allocations),
                       static_cast<long long>(c.freed_bytes), static_cast<long long>(c.frees));
}

PyMethodDef g_methods[] = {
    {"memory_alloc", memory_alloc, METH_O, "count an allocation of nbytes (stats.record_alloc once installed)"},
    {"memory_free", memory_free, METH_O, "count a free of nbytes (stats.record_free once installed)"},
    {"memory_take", memory_take, METH_NOARGS,
     "(net bytes, highest net bytes, net buffers, highest net buffers, allocated bytes, allocations, freed bytes, "
     "frees) since the last call, and start over"},
    {nullptr, nullptr, 0, nullptr}};

}  // namespace

namespace tpu_native {

bool register_memory_counters(PyObject* module) {
  return PyModule_AddFunctions(module, g_methods) == 0;
}

}  // namespace tpu_native
