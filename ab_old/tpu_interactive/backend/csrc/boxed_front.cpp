// The fast path's front end on torch's own IValues: a fronted op's tpu kernel registered with torch in C++.
//
// torch.library registers a Python kernel as a PythonKernelHolder: every call turns the dispatcher's
// IValues into Python arguments (a Python tensor object for each tensor, made if it has none), calls the
// kernel, and turns its Python result back into IValues. For a call a plan serves, that was ~7% of a fused
// training step of a small block, more than the plan itself. Here the call is keyed from the IValues
// directly, exactly as the Python front (python_front.cpp) keys the arguments PythonKernelHolder would
// have handed it: the same arguments (parseIValuesToPyArgsKwargs leaves out trailing defaults), lists,
// dtypes as the torch.dtype objects it would make. A hit runs the same plan and pushes its tensors as
// IValues (no Python tensor objects); anything else (no plan yet, a call the plan declines, a dispatch
// mode, a tensor with the Python key, an argument type not keyed here) goes the way PythonKernelHolder
// goes, to the FastKernel object, which keys the call again and runs or offers the plan as before.
// fast_check_keys(True) (the test suite) has every call this front keys also keyed the Python front's way,
// and the two keys compared.
#include "fast_dispatch.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/csrc/utils/tensor_memoryformats.h>
#include <torch/library.h>

namespace {

using tpu_fast::put;

// How parseIValuesToPyArgsKwargs hands an argument holding an int: as a torch.dtype / layout /
// memory_format object where its schema type says so, else as an int.
enum class Kind : uint8_t { kOther, kDtype, kLayout, kMemoryFormat };

Kind kind_of(const c10::Argument& arg) {
  auto is = [&arg](c10::TypeKind kind) {
    const auto& type = arg.real_type();
    if (type->kind() == kind)
      return true;
    auto optional = type->cast<c10::OptionalType>();
    return optional && optional->getElementType()->kind() == kind;
  };
  if (is(c10::ScalarTypeType::Kind))
    return Kind::kDtype;
  if (is(c10::LayoutType::Kind))
    return Kind::kLayout;
  if (is(c10::MemoryFormatType::Kind))
    return Kind::kMemoryFormat;
  return Kind::kOther;
}

// The torch.dtype / layout / memory_format object (borrowed: torch's interned ones) for an argument of
// that kind holding `value`; null for a value out of the enum's range.
PyObject* singleton_of(Kind kind, int64_t value) {
  if (kind == Kind::kDtype && value >= 0 && value < static_cast<int64_t>(c10::ScalarType::NumOptions))
    return reinterpret_cast<PyObject*>(torch::getTHPDtype(static_cast<c10::ScalarType>(value)));
  if (kind == Kind::kLayout && value >= 0 && value < static_cast<int64_t>(c10::Layout::NumOptions))
    return reinterpret_cast<PyObject*>(torch::getTHPLayout(static_cast<c10::Layout>(value)));
  if (kind == Kind::kMemoryFormat && value >= 0 && value < static_cast<int64_t>(c10::MemoryFormat::NumOptions))
    return torch::utils::getTHPMemoryFormat(static_cast<c10::MemoryFormat>(value));
  return nullptr;
}

// The object torch hands a Python kernel for argument value `v` (its kind from the schema).
py::object to_python(const c10::IValue& v, Kind kind) {
  if (v.isNone() || kind == Kind::kOther || !v.isInt())
    return torch::jit::toPyObject(v);
  PyObject* singleton = singleton_of(kind, v.toInt());
  TORCH_CHECK(singleton != nullptr, "unsupported dtype, layout or memory format value ", v.toInt());
  return py::reinterpret_borrow<py::object>(singleton);
}

int64_t g_boxed_hits = 0;      // calls served here from a plan
bool g_check_keys = false;     // key each call the Python front's way too and compare (tests)

bool encode_double(double value, std::string& key, std::vector<PyObject*>& arrays) {  // as a Python float
  PyObject* number = PyFloat_FromDouble(value);
  bool encoded = number != nullptr && tpu_fast::encode_float(number, key, arrays);
  Py_XDECREF(number);
  PyErr_Clear();
  return encoded;
}

// A Python number torch wrapped as a 0-dim cpu tensor (`x / 4`): torch hands a Python kernel the number.
bool encode_wrapped_number(const at::Tensor& t, std::string& key, std::vector<PyObject*>& arrays) {
  arrays.push_back(nullptr);
  switch (t.scalar_type()) {
    case at::kBool:
      put(key, 'B');
      put(key, *t.const_data_ptr<bool>());
      return true;
    case at::kLong:
      put(key, 'I');
      put(key, *t.const_data_ptr<int64_t>());
      return true;
    case at::kDouble:
      return encode_double(*t.const_data_ptr<double>(), key, arrays);
    default:  // a complex number: not keyed by either front
      return false;
  }
}

// One argument slot, as encode_value keys the Python object torch would make of it.
bool encode_ivalue(const c10::IValue& v, Kind kind, std::string& key, std::vector<PyObject*>& arrays, bool views) {
  if (v.isTensor() && v.toTensor().defined() && v.toTensor().unsafeGetTensorImpl()->is_wrapped_number())
    return encode_wrapped_number(v.toTensor(), key, arrays);
  if (v.isTensor()) {
    const at::Tensor& t = v.toTensor();
    if (t.defined()) {  // (a tensor subclass with the Python key goes where PythonKernelHolder sends it)
      return !t.key_set().has(c10::DispatchKey::Python) && tpu_fast::encode_tensor(t, key, arrays, views);
    }
  }
  arrays.push_back(nullptr);
  if (v.isNone() || v.isTensor()) {  // an undefined tensor is None to Python
    put(key, 'N');
  } else if (v.isBool()) {
    put(key, 'B');
    put(key, v.toBool());
  } else if (v.isInt() && kind != Kind::kOther) {
    PyObject* singleton = singleton_of(kind, v.toInt());
    if (singleton == nullptr)
      return false;
    tpu_fast::encode_singleton(singleton, key);
  } else if (v.isInt() || v.isSymInt()) {
    std::optional<int64_t> value = v.isInt() ? std::optional<int64_t>(v.toInt()) : v.toSymInt().maybe_as_int();
    if (!value)
      return false;
    put(key, 'I');
    put(key, *value);
  } else if (v.isDouble()) {
    return encode_double(v.toDouble(), key, arrays);
  } else if (v.isString()) {
    const std::string& text = v.toStringRef();
    tpu_fast::encode_text(text.data(), static_cast<Py_ssize_t>(text.size()), key);
  } else if (v.isDevice()) {
    tpu_fast::encode_device(v.toDevice(), key);
  } else {
    return false;
  }
  return true;
}

// A top-level argument, as encode_argument keys it: a list one slot per item (torch hands lists to Python
// as lists; their items are never dtype objects).
bool encode_ivalue_argument(const c10::IValue& v, Kind kind, std::string& key, std::vector<PyObject*>& arrays,
                            bool list_views) {
  if (v.isList()) {
    c10::ArrayRef<c10::IValue> items = v.toListRef();
    put(key, 'L');
    put(key, static_cast<int64_t>(items.size()));
    for (const c10::IValue& item : items) {
      if (item.isList() || item.isTuple() || !encode_ivalue(item, Kind::kOther, key, arrays, list_views))
        return false;
    }
    return true;
  }
  return !v.isTuple() && encode_ivalue(v, kind, key, arrays, true);
}

struct BoxedFront final : c10::OperatorKernel {
  PyObject* kernel;  // the op's FastKernel (a reference kept for good: torch may call kernels during exit)
  tpu_fast::Op* op;
  // from the schema, at the first call (an op torch.library accepts may get its schema after registration:
  // index_put.hacked_twin): where kwarg-only arguments start, each argument's kind and the key bytes of its
  // name (a keyword argument's key starts with them)
  bool described = false;
  size_t kwarg_only_start = 0;
  std::vector<Kind> kinds;
  std::vector<std::string> names;
  size_t returns = 0;         // how many values the op returns
  bool returns_list = false;  // one list of tensors (a functional foreach op)

  BoxedFront(PyObject* kernel, tpu_fast::Op* op) : kernel(kernel), op(op) {}

  void describe(const c10::FunctionSchema& schema) {
    const auto& arguments = schema.arguments();
    kwarg_only_start = arguments.size();
    while (kwarg_only_start > 0 && arguments[kwarg_only_start - 1].kwarg_only())
      --kwarg_only_start;
    for (const auto& arg : arguments) {
      kinds.push_back(kind_of(arg));
      std::string name;
      tpu_fast::encode_text(arg.name().data(), static_cast<Py_ssize_t>(arg.name().size()), name);
      names.push_back(std::move(name));
    }
    returns = schema.returns().size();
    returns_list = returns == 1 && schema.returns()[0].real_type()->kind() == c10::TypeKind::ListType;
    described = true;
  }

  // Whether the plan's results are what the schema returns, pushed as they are (else the Python front)
  bool fits(const tpu_fast::Plan& plan) const {
    if (!plan.fixed.empty())  // a tuple with None or ints in it
      return false;
    if (plan.inplace)
      return plan.single ? returns == 1 : returns == 0;  // self, or nothing (a foreach op)
    return plan.single ? returns == 1 && !returns_list : returns_list || returns == plan.dtypes.size();
  }

  // Python kernels get arguments as torch's parseIValuesToPyArgsKwargs makes them (libtorch_python does not
  // export it): positional up to the last one not at its default, keyword-only ones not at their defaults.
  static bool is_default(const c10::FunctionSchema& schema, c10::ArrayRef<c10::IValue> args, size_t i) {
    const auto& fallback = schema.arguments()[i].default_value();
    return fallback.has_value() && !(*fallback != args[i]);
  }

  size_t positional_count(const c10::FunctionSchema& schema, c10::ArrayRef<c10::IValue> args) const {
    size_t positional = kwarg_only_start;
    while (positional > 0 && is_default(schema, args, positional - 1))
      --positional;
    return positional;
  }

  std::pair<py::tuple, py::dict> python_arguments(const c10::FunctionSchema& schema, c10::ArrayRef<c10::IValue> args) {
    size_t positional = positional_count(schema, args);
    py::tuple py_args(positional);
    for (size_t i = 0; i < positional; ++i)
      py_args[i] = to_python(args[i], kinds[i]);
    py::dict kwargs;
    for (size_t i = kwarg_only_start; i < args.size(); ++i) {
      if (!is_default(schema, args, i))
        kwargs[py::str(schema.arguments()[i].name())] = to_python(args[i], kinds[i]);
    }
    return {std::move(py_args), std::move(kwargs)};
  }

  // A Python kernel's result on the stack, as torch's pushPyOutToStack puts it (also not exported).
  static void push_python_result(const c10::FunctionSchema& schema, torch::jit::Stack* stack, const py::object& out) {
    const auto& returns = schema.returns();
    if (returns.empty()) {
      TORCH_CHECK(out.is_none(), "tpu kernel for ", schema.name(), " returned a value where it returns None");
    } else if (returns.size() == 1) {
      stack->push_back(torch::jit::toIValue(out, returns[0].real_type()));
    } else {
      auto items = py::cast<py::sequence>(out);
      TORCH_CHECK(items.size() == returns.size(), "tpu kernel for ", schema.name(), " returned ", items.size(),
                  " values, not ", returns.size());
      for (size_t i = 0; i < returns.size(); ++i)
        stack->push_back(torch::jit::toIValue(items[i], returns[i].real_type()));
    }
  }

  // The call's key in scratch (as the Python front's): false where not eligible (arrays released).
  bool encode(const c10::FunctionSchema& schema, c10::ArrayRef<c10::IValue> args, tpu_fast::Scratch& scratch) {
    tpu_fast::begin_key(*op, scratch);
    size_t positional = positional_count(schema, args);
    bool eligible = true;
    if (op->inplace) {  // self: a tpu tensor, or a foreach op's list of them
      eligible = positional > 0;
      if (eligible && args[0].isTensor()) {
        eligible = args[0].toTensor().defined();
        if (eligible)
          tpu_fast::t_self_storages.emplace(args[0].toTensor().storage().unsafeGetStorageImpl(), 0);
      } else if (eligible && args[0].isList()) {
        c10::ArrayRef<c10::IValue> items = args[0].toListRef();
        for (size_t i = 0; eligible && i < items.size(); ++i) {
          eligible = items[i].isTensor() && items[i].toTensor().defined();
          if (eligible)
            tpu_fast::t_self_storages.emplace(items[i].toTensor().storage().unsafeGetStorageImpl(), static_cast<int32_t>(i));
        }
      } else {
        eligible = false;
      }
    }
    for (size_t i = 0; eligible && i < positional; ++i)
      eligible = encode_ivalue_argument(args[i], kinds[i], scratch.key, scratch.arrays,
                                        op->list_views && !(op->inplace && i == 0));
    for (size_t i = kwarg_only_start; eligible && i < args.size(); ++i) {
      if (is_default(schema, args, i))
        continue;
      scratch.key.append(names[i]);
      eligible = encode_ivalue_argument(args[i], kinds[i], scratch.key, scratch.arrays, op->list_views);
    }
    tpu_fast::t_self_storages.clear();
    if (!eligible)
      tpu_fast::release(scratch.arrays);
    return eligible;
  }

  // The Python front's key for the same call must be this one (a key this front makes differently would
  // miss every plan, or find another call's).
  void check_key(const c10::OperatorHandle& handle, c10::ArrayRef<c10::IValue> args, const std::string& key,
                 size_t slots) {
    auto [py_args, py_kwargs] = python_arguments(handle.schema(), args);
    tpu_fast::Scratch python;
    bool eligible = tpu_fast::encode_call(*op, py_args.ptr(), py_kwargs.ptr(), python);
    if (eligible)
      tpu_fast::release(python.arrays);
    TORCH_CHECK(eligible && python.key == key && python.arrays.size() == slots, "tpu internal error: ",
                handle.schema().name(), "'s call is keyed differently from its Python arguments");
  }

  // The call served from its plan, its results pushed; false where the plan did not serve it and the Python
  // kernel must run it (`plain`: without a plan offered), or (with a Python error set) where that raised.
  enum class Served { kYes, kNo, kPlain, kError };

  Served serve(const c10::OperatorHandle& handle, torch::jit::Stack* stack, tpu_fast::Scratch& scratch) {
    auto start = std::chrono::steady_clock::now();
    const auto& schema = handle.schema();
    size_t n = schema.arguments().size();
    c10::ArrayRef<c10::IValue> args = torch::jit::last(*stack, n);
    if (!encode(schema, args, scratch))
      return Served::kNo;
    if (g_check_keys)
      check_key(handle, args, scratch.key, scratch.arrays.size());
    std::shared_ptr<const tpu_fast::Plan> held = tpu_fast::find_plan(*op, scratch.key);
    if (held == nullptr || !fits(*held)) {
      tpu_fast::release(scratch.arrays);
      return Served::kNo;
    }
    PyObject* result = nullptr;
    switch (tpu_fast::run_plan(*op, scratch, *held, &result)) {
      case tpu_fast::Ran::kDone:
        break;
      case tpu_fast::Ran::kError:
        return Served::kError;
      default:
        return Served::kPlain;
    }
    const tpu_fast::Plan& plan = *held;
    if (plan.inplace) {
      std::vector<at::Tensor> selves = plan.single ? std::vector<at::Tensor>{args[0].toTensor()} : args[0].toTensorVector();
      if (!tpu_fast::write_results(plan, selves, result))
        return plan.single && tpu_fast::recoverable() && !plan.recording ? Served::kPlain : Served::kError;
      c10::IValue self = args[0];
      torch::jit::drop(*stack, n);
      if (plan.single)
        stack->push_back(std::move(self));  // a foreach op returns nothing
    } else {
      std::vector<at::Tensor> outputs;
      for (size_t i = 0; i < plan.dtypes.size(); ++i) {
        outputs.push_back(tpu_fast::output_tensor(plan, i, plan.single ? result : PySequence_Fast_GET_ITEM(result, i)));
        if (!outputs.back().defined())
          break;
      }
      Py_DECREF(result);
      if (!outputs.back().defined())  // e.g. over the memory limit
        return tpu_fast::recoverable() ? Served::kPlain : Served::kError;  // the Python kernel raises it, annotated
      torch::jit::drop(*stack, n);
      if (returns_list) {
        stack->push_back(c10::IValue(std::move(outputs)));
      } else {
        for (auto& output : outputs)
          stack->push_back(std::move(output));
      }
    }
    tpu_fast::count_call(*op, plan, start);
    ++g_boxed_hits;
    return Served::kYes;
  }

  void operator()(const c10::OperatorHandle& handle, c10::DispatchKeySet, torch::jit::Stack* stack) {
    py::gil_scoped_acquire gil;
    if (!described)
      describe(handle.schema());
    Served served = Served::kNo;
    if (tpu_fast::g_enabled && !tpu_fast::t_scratch_busy && c10::impl::TorchDispatchModeTLS::stack_len() == 0) {
      tpu_fast::t_scratch_busy = true;
      try {
        served = serve(handle, stack, tpu_fast::t_scratch);
      } catch (...) {
        tpu_fast::t_scratch_busy = false;
        throw;
      }
      tpu_fast::t_scratch_busy = false;
    }
    if (served == Served::kYes)
      return;
    if (served == Served::kError)
      throw python_error();
    // as PythonKernelHolder calls a Python kernel (a dispatch mode or a Python-key tensor would make it call
    // the same kernel through the op's Python registration)
    const auto& schema = handle.schema();
    auto arguments = torch::jit::pop(*stack, schema.arguments().size());
    auto [args, kwargs] = python_arguments(schema, arguments);
    arguments.clear();  // as torch's: the Python objects hold the tensors now
    PyObject* out = served == Served::kPlain ? tpu_fast::call_python_kernel(kernel, args.ptr(), kwargs.ptr())
                                             : PyObject_Call(kernel, args.ptr(), kwargs.ptr());
    if (out == nullptr)
      throw python_error();
    push_python_result(schema, stack, py::reinterpret_steal<py::object>(out));
  }
};

}  // namespace

void register_boxed_front(py::module_& m) {
  m.def("fast_register", [](const std::string& name, py::object kernel) {
    static auto* library = new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::PrivateUse1,
                                              __FILE__, __LINE__);  // leaked: torch may call kernels during exit
    tpu_fast::Op* op = tpu_fast::kernel_op(kernel.ptr());
    TORCH_CHECK(op != nullptr, "fast_register: not a FastKernel");
    library->impl(name.c_str(), torch::CppFunction::makeFromBoxedFunctor(
                                    std::make_unique<BoxedFront>(kernel.release().ptr(), op)));
  }, "register a FastKernel as the op's PrivateUse1 kernel through its C++ front end");
  m.def("fast_is_kernel", [](py::handle kernel) { return tpu_fast::kernel_op(kernel.ptr()) != nullptr; });
  m.def("fast_check_keys", [](bool on) { g_check_keys = on; }, "key each call the Python front's way too and compare the keys (tests)");
  m.def("fast_boxed_hits", []() { return g_boxed_hits; }, "calls served from a plan by the C++ front end");
}
