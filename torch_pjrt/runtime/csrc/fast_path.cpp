// The eager fast path: the PrivateUse1 kernel of a table op, in C++; and SDPA's backend
// choice for pjrt tensors.
//
// Crossing from the dispatcher into a Python kernel converts every argument and
// costs about as much as the XLA call itself. For the common call (tensor operands and
// tensor lists of pjrt tensors on one device, Python numbers and lists of them, plain
// static arguments) this
// kernel builds the op's executable arguments and wraps its results here; every other
// call goes to the op's Python kernel (eager.Kernel), which owns the full semantics.
#include "bindings.h"

#include <cmath>
#include <limits>

#include <ATen/Context.h>
#include <ATen/SDPBackend.h>
#include <ATen/native/transformers/attention.h>
#include <ATen/core/ivalue.h>
#include <ATen/core/stack.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/csrc/utils/tensor_memoryformats.h>
#include <torch/csrc/utils/tensor_numpy.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <unordered_map>

// torch's IValue -> Python conversion, exported by libtorch_python. Declared here rather
// than through its header (torch/csrc/jit/python/pybind_utils.h), which pulls in the
// TorchScript frontend and doubles this unit's build time; the declaration has been the
// same since torch 1.x, and a change would fail loudly at import (an undefined symbol).
namespace torch::jit {
TORCH_PYTHON_API pybind11::object toPyObject(c10::IValue ivalue);
}  // namespace torch::jit

namespace torch_pjrt {

enum ArgKind : int {
  kTensor = 0, kScalar = 1, kStatic = 2, kDtype = 3, kLayout = 4, kMemoryFormat = 5, kTensorList = 6, kScalarList = 7,
  kDevice = 8,  // a factory's device: a static argument that also says where the call runs
  kCheckedScalar = 9,  // a Scalar that must fit the result's dtype, as CPU converts it (an entry's `scalar_fits`)
  kCheckedStatic = 10  // the same, for a Scalar the entry keeps static (hardtanh's bounds)
};

struct EagerHelpers {
  PyObject* weak_scalar = nullptr;   // eager._weak_scalar: a Python number as a cached weakly typed JAX scalar
  PyObject* read_lazily = nullptr;   // storage.read_lazily: a view's operand
  PyObject* record = nullptr;        // storage._recent.append: synchronize's bookkeeping
  PyObject* array_type = nullptr;    // jax's concrete array class
  PyObject* strided_view = nullptr;  // storage.view_of (a StridedView)
  PyObject* record_call = nullptr;   // fused.record(recordable, args): a call recorded into the region
  std::array<PyObject*, 64> jax_dtypes{};  // by torch ScalarType; nullptr where JAX has none
};
static EagerHelpers g_eager;

struct TransferHelpers {  // ToCopyKernel's uploads (set_transfer_helpers)
  PyObject* put = nullptr;    // platform.put(numpy array, device index) -> a committed array
  PyObject* facts = nullptr;  // transfer.device_facts(device index, dtype) -> (aliases host memory, holds dtype)
};
static TransferHelpers g_transfer;

static bool is_array(PyObject* o) { return Py_TYPE(o) == reinterpret_cast<PyTypeObject*>(g_eager.array_type); }

// `array`'s bytes (row-major) on the host, in `view` (the caller releases it), and the object that
// holds them: the array itself through the buffer protocol where JAX offers it (CPU arrays), else a
// numpy copy (a device array, or a dtype the buffer protocol lacks: bfloat16).
static py::object host_bytes(const py::object& array, Py_buffer* view) {
  if (PyObject_GetBuffer(array.ptr(), view, PyBUF_C_CONTIGUOUS) == 0) return array;
  PyErr_Clear();
  // platform.host_value: numpy's copy, with XLA's out-of-memory error raised as torch's
  static PyObject* host_value =
      py::object(py::module_::import("torch_pjrt.runtime.platform").attr("host_value")).release().ptr();
  PyObject* copy = PyObject_CallOneArg(host_value, array.ptr());
  if (!copy) throw python_error();
  py::object host = py::reinterpret_steal<py::object>(copy);
  if (PyObject_GetBuffer(host.ptr(), view, PyBUF_C_CONTIGUOUS) < 0) throw python_error();
  return host;
}
GrowthHelpers g_growth;

static bool g_fused = false;  // fused eager (runtime/fused.py): kernels record their calls

// A C++ kernel's entry is a safe point (between calls, outside any trace; runtime/safe_point.py):
// runtime/executable_budget.py's state (a dict whose "due" says the process is over its budget)
// and release_if_due, and runtime/default_dtype.py's check, called when torch's default dtype is
// not the one traces were made with. So a process whose calls are all C++ still releases and
// still sees a new default dtype: the tests cost a dict lookup and a compare.
static PyObject* g_budget_state = nullptr;
static PyObject* g_budget_release = nullptr;
static PyObject* g_due = nullptr;  // interned "due"
static PyObject* g_check_default_dtype = nullptr;
static caffe2::TypeMeta g_traced_default_dtype;

void safe_point() {
  if (!g_budget_state) return;
  PyObject* due = PyDict_GetItemWithError(g_budget_state, g_due);  // borrowed
  if (due == Py_True) {
    PyObject* r = PyObject_CallNoArgs(g_budget_release);
    if (!r) throw python_error();
    Py_DECREF(r);
  } else if (!due && PyErr_Occurred()) {
    throw python_error();
  }
  const caffe2::TypeMeta now = c10::get_default_dtype();
  if (now != g_traced_default_dtype) {
    PyObject* r = PyObject_CallNoArgs(g_check_default_dtype);
    if (!r) throw python_error();
    Py_DECREF(r);
    g_traced_default_dtype = now;
  }
}

struct IndexCheckHelpers {  // runtime/index_checks.py
  PyObject* lock = nullptr;           // _lock
  PyObject* seen = nullptr;           // _seen: device -> flag (a dict)
  PyObject* queued = nullptr;         // _queued (a list)
  PyObject* nothing_seen = nullptr;   // _nothing_seen(device)
  PyObject* raise_pending = nullptr;  // raise_pending()
  PyObject* raise_if_found = nullptr;  // raise_if_found(seen, queued)
  Py_ssize_t max_queued = 0;
};
static IndexCheckHelpers g_checks;

// A bool flag's value read on the host through the buffer protocol (a CPU array); -1 where it
// cannot be read so (a device array: the caller asks Python).
static int host_flag(PyObject* array) {
  Py_buffer view;
  if (PyObject_GetBuffer(array, &view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
    PyErr_Clear();
    return -1;
  }
  int flag = view.format && std::strcmp(view.format, "?") == 0 && view.len == 1
                 ? *static_cast<const char*>(view.buf) != 0 : -1;
  PyBuffer_Release(&view);
  return flag;
}

// index_checks.raise_pending in C++ for a host sync of a C++ kernel: the queued checks are taken
// off the queue and each device's seen flag read here (its region run first); Python
// (index_checks.raise_if_found) only where a flag is set, to raise the first finding, or cannot
// be read here.
static void raise_pending_index_checks() {
  if (!PyList_GET_SIZE(g_checks.queued)) return;  // the common case
  py::object seen, queued;
  {
    PyLockGuard lock(g_checks.lock);
    seen = py::reinterpret_steal<py::object>(PyDict_Values(g_checks.seen));
    queued = py::reinterpret_steal<py::object>(PyList_GetSlice(g_checks.queued, 0, PyList_GET_SIZE(g_checks.queued)));
    if (!seen || !queued) throw python_error();
    PyDict_Clear(g_checks.seen);
    if (PyList_SetSlice(g_checks.queued, 0, PyList_GET_SIZE(g_checks.queued), nullptr) < 0) throw python_error();
  }
  bool ask_python = false;
  for (Py_ssize_t i = 0; i < PyList_GET_SIZE(seen.ptr()) && !ask_python; i++) {
    py::object flag = py::reinterpret_borrow<py::object>(PyList_GET_ITEM(seen.ptr(), i));
    if (is_pending(flag.ptr())) flag = pending_value(flag.ptr());
    ask_python = !flag || host_flag(flag.ptr()) != 0;
  }
  if (!ask_python) return;
  PyObject* r = PyObject_CallFunctionObjArgs(g_checks.raise_if_found, seen.ptr(), queued.ptr(), nullptr);
  if (!r) throw python_error();
  Py_DECREF(r);
}

// TORCH_PJRT_SYNC_INDEX_CHECKS (index_checks.synchronous), read per call as Python reads it
static bool synchronous_index_checks() {
  const char* v = std::getenv("TORCH_PJRT_SYNC_INDEX_CHECKS");
  return v && *v && std::strcmp(v, "0") != 0;
}

static py::tuple int_tuple(c10::IntArrayRef values) {
  py::tuple out(values.size());
  for (size_t i = 0; i < values.size(); i++) PyTuple_SET_ITEM(out.ptr(), i, PyLong_FromLongLong(values[i]));
  return out;
}

// storage.read_lazily in C++ for a view whose storage buffer is already there: a
// StridedView with the geometry storage.py builds (the consuming executable resolves it).
static py::object lazy_view(const at::Tensor& t, const Holder* h) {
  auto dtype_index = static_cast<size_t>(t.scalar_type());
  PyObject* dtype = dtype_index < g_eager.jax_dtypes.size() ? g_eager.jax_dtypes[dtype_index] : nullptr;
  if (dtype && h && h->buffer &&
      c10::multiply_integers(h->shape) * int64_t(c10::elementSize(h->dtype)) >= int64_t(t.storage().nbytes())) {
    py::tuple geometry = py::make_tuple(int_tuple(t.sizes()), int_tuple(t.strides()), t.storage_offset(),
                                        py::handle(dtype), py::bool_(t.is_conj()), py::bool_(t.is_neg()));
    py::object view = strided_view(h->buffer, geometry.ptr());
    if (view) return view;
    if (Py_TYPE(h->buffer) == reinterpret_cast<PyTypeObject*>(g_growth.padded_type))
      return padded_view(h->buffer, geometry.ptr());
    PyObject* other = PyObject_CallFunctionObjArgs(g_eager.strided_view, h->buffer, geometry.ptr(), nullptr);
    if (!other) throw python_error();
    return py::reinterpret_steal<py::object>(other);
  }
  PyObject* view = PyObject_CallOneArg(g_eager.read_lazily, py::cast(t).ptr());  // creates or grows the buffer
  if (!view) throw python_error();
  return py::reinterpret_steal<py::object>(view);
}

// Weak scalars by (kind, bits): converting a Python number costs a host-to-device copy.
static std::unordered_map<uint64_t, PyObject*> g_weak_scalars[3];  // int, double, bool

static PyObject* weak_scalar(const c10::Scalar& s) {
  int kind;
  uint64_t bits;
  py::object value;
  if (s.isBoolean()) {
    kind = 2, bits = s.toBool(), value = py::bool_(s.toBool());
  } else if (s.isIntegral(false)) {
    if (s.type() == c10::ScalarType::UInt64) return nullptr;  // beyond int64 (a uint64 value): the Python kernel
    int64_t v = s.toLong();
    kind = 0, bits = uint64_t(v), value = py::int_(v);
  } else if (s.isFloatingPoint()) {
    double v = s.toDouble();
    std::memcpy(&bits, &v, sizeof(v));
    kind = 1, value = py::float_(v);
  } else {
    return nullptr;  // complex and symbolic: the Python kernel
  }
  auto& cache = g_weak_scalars[kind];
  auto it = cache.find(bits);
  if (it != cache.end()) return it->second;
  PyObject* array = PyObject_CallOneArg(g_eager.weak_scalar, value.ptr());
  if (!array) throw python_error();
  if (cache.size() > 4096) {
    for (auto& [_, v] : cache) Py_DECREF(v);
    cache.clear();
  }
  cache.emplace(bits, array);
  return array;
}

// A static argument as the Python value the executable keys on (lists become tuples).
static py::object static_value(const c10::IValue& v, int kind) {
  if (v.isNone()) return py::none();
  switch (kind) {
    case kDtype:
      return py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(torch::getTHPDtype(c10::ScalarType(v.toInt()))));
    case kLayout:
      return py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(torch::getTHPLayout(c10::Layout(v.toInt()))));
    case kMemoryFormat:
      return py::reinterpret_borrow<py::object>(torch::utils::getTHPMemoryFormat(c10::MemoryFormat(v.toInt())));
  }
  py::object o = torch::jit::toPyObject(v);
  if (PyList_Check(o.ptr())) return py::reinterpret_steal<py::object>(PyList_AsTuple(o.ptr()));
  return o;
}

// synchronize()'s bookkeeping of recent results (storage._recent)
static void record(PyObject* array) {
  PyObject* ok = PyObject_CallOneArg(g_eager.record, array);
  if (!ok) throw python_error();
  Py_DECREF(ok);
}

bool store_whole(const at::Tensor& self, const py::object& result) {
  Holder* h = holder_of(self.storage());
  bool pending = is_pending(result.ptr());
  if (!(pending || Py_TYPE(result.ptr()) == reinterpret_cast<PyTypeObject*>(g_eager.array_type)) ||
      !is_whole_storage(self, h))
    return false;
  const ArrayType& type = array_type(result);
  if (c10::IntArrayRef(type.shape) != self.sizes() || type.dtype != h->dtype) return false;
  if (!pending) record(result.ptr());
  PyObject* old = h->buffer;
  note_replaced(result.ptr(), old);
  h->buffer = py::object(result).release().ptr();
  h->shape = type.shape;  // a reshape of the storage takes the buffer in its own shape, as storage.write does
  h->appended = false;
  Py_DECREF(old);
  return true;
}

// Whether an in-place result may be written into self by torch's casting rules (an array or a
// pending value; anything else is left to the store's own check).
static bool castable_into(const py::object& result, const at::Tensor& self) {
  if (!is_pending(result.ptr()) && Py_TYPE(result.ptr()) != reinterpret_cast<PyTypeObject*>(g_eager.array_type))
    return true;
  return c10::canCast(array_type(result).dtype, self.scalar_type());
}

class FastKernel : public c10::OperatorKernel {
 public:
  // `run`: the op's executable; `recorded`: the same as a fused.Recordable, called in fused mode.
  // `store` is None for a functional op; for an in-place op (self first), the Python
  // function that writes a result into self when it is not simply self's new buffer.
  // `described`: the kernel needs its call signature's description (Recordable.describe, a
  // kernels.SignatureTraits: index checks' exceptions, whether the result is an append's, int
  // returns), so only its recorded calls are served here. `checked`: an indexing op whose
  // `recorded` has its index checks folded in (index_checks.folded). `grows`: an op over growing
  // storages (ops/growth.py), served here only when none of its operands grows.
  FastKernel(std::string name, py::object run, py::object recorded, py::object slow, py::object store,
             std::vector<int> kinds, bool described = false, bool checked = false, bool grows = false)
      : name_(std::move(name)), run_(run.release().ptr()), recorded_(recorded.release().ptr()),
        slow_(slow.release().ptr()), store_(store.is_none() ? nullptr : store.release().ptr()),
        kinds_(std::move(kinds)), described_(described), checked_(checked), grows_(grows), recorder_(recorded_) {
    for (size_t i = 0; i < kinds_.size(); i++) {
      has_operands_ |= kinds_[i] == kTensor || kinds_[i] == kTensorList;
      if (kinds_[i] == kCheckedScalar) checked_scalars_.push_back(int(i)), kinds_[i] = kScalar;
      if (kinds_[i] == kCheckedStatic) checked_scalars_.push_back(int(i)), kinds_[i] = kStatic;
      if (kinds_[i] == kDtype && dtype_at_ < 0) dtype_at_ = int(i);
      if ((kinds_[i] == kTensor || kinds_[i] == kTensorList) && tensor_at_ < 0) tensor_at_ = int(i);
    }
  }

  // Calls served here (their executable run, or their call recorded) and calls that entered
  // the Python kernel; the GIL guards them. eager_stats()'s "paths" reads them.
  const std::string name_;
  int64_t fast_calls_ = 0;
  int64_t slow_calls_ = 0;

  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
    const size_t n = kinds_.size();
    py::gil_scoped_acquire gil;
    safe_point();
    py::object result, traits;
    int device = -1;
    PaddedCall padded;  // per call, not per kernel: another thread may run this kernel while this call waits
    {
      auto args = torch::jit::last(*stack, n);
      py::tuple values(n);
      bool fast = true;
      for (size_t i = 0; i < n && fast; i++) {
        py::object value = operand(args[i], kinds_[i], device, fast, store_ && i == 0, padded);
        if (fast) PyTuple_SET_ITEM(values.ptr(), i, value.release().ptr());
      }
      // a factory on another device than pjrt:0 commits its outputs there (fused.Recordable.on)
      if (!fast || device < 0 || (device != 0 && !has_operands_)) return slow(op, stack, n);
      // a value CPU would not convert: the Python kernel lets CPU name the error (index_fill checks
      // a complex value first, in its own words)
      if (!checked_scalars_.empty() && !scalar_fits(args)) return slow(op, stack, n);
      // an in-place op reading its own storage through another argument: CPU refuses some of these
      // (partial overlaps; the same tensor for ops other than elementwise ones); the Python kernel checks
      if (store_ && reads_written_storage(args)) return slow(op, stack, n);
      result = call(args.data(), values, device, traits, padded);
      if (!result) return slow(op, stack, n);
    }
    if (store_) {
      c10::IValue self = (*stack)[stack->size() - n];
      // a result CPU would not cast into self (ldexp_ of an int64 self): the Python kernel raises CPU's
      // own error, in its words ("ldexp can't be cast to the desired output type Long")
      if (self.isTensor() && !castable_into(result, self.toTensor())) return slow(op, stack, n);
      torch::jit::drop(*stack, n);
      if (self.isTensorList()) {  // a foreach op_: each tensor takes its result; it returns nothing
        auto targets = self.toTensorList();
        py::sequence results = py::reinterpret_borrow<py::sequence>(result);
        for (size_t i = 0; i < targets.size(); i++) store(targets[i], results[i]);
        return;
      }
      store(self.toTensor(), result);
      torch::jit::push(*stack, std::move(self));
      return;
    }
    torch::jit::drop(*stack, n);
    push_results(op, stack, result, c10::DeviceIndex(device), traits, padded);
  }

 protected:
  // The op's executable on `values`, or in fused mode its call recorded (in C++ where the recorder
  // can, else by fused.record); a null object when the call failed: the Python kernel runs it
  // again and raises what CPU torch raises (errors.py).
  // `traits`: the signature's description, for a described kernel.
  py::object call(const c10::IValue* args, const py::tuple& values, int device, py::object& traits,
                  const PaddedCall& padded = {}) {
    if (described_) return call_described(args, values, device, traits, padded);
    PyObject* out;
    if (g_fused && !at::globalContext().deterministicAlgorithms()) {  // Recordable.__call__'s test
      out = recorder_.record(args, values.ptr(), device);
      if (!out && !PyErr_Occurred()) out = PyObject_CallFunctionObjArgs(g_eager.record_call, recorded_, values.ptr(), nullptr);
    } else {
      out = PyObject_Call(run_, values.ptr(), nullptr);
    }
    if (!out) {
      if (PyErr_ExceptionMatches(PyExc_KeyboardInterrupt)) throw python_error();
      PyErr_Clear();
      return py::object();
    }
    fast_calls_++;
    return py::reinterpret_steal<py::object>(out);
  }

  // The call of a described kernel: recorded (its signature's description comes with it) or left
  // to the Python kernel (op by op, deterministic mode, synchronous index checks, a call the
  // recorder leaves to fused.record). An indexing op's call is made as index_checks.run_checked
  // makes it: with the device's seen flag as its last operand; the new flag and each probe's
  // findings (found, position, value) go to the queue beside the exception and op its
  // description names.
  py::object call_described(const c10::IValue* args, const py::tuple& values, int device, py::object& traits,
                            const PaddedCall& padded) {
    if (!g_fused || at::globalContext().deterministicAlgorithms() || (checked_ && synchronous_index_checks()))
      return py::object();
    py::object result;
    bool over_bound = false;
    {
      std::optional<PyLockGuard> lock;
      py::object device_key = py::int_(device);
      py::tuple operands = values;
      if (checked_) {
        lock.emplace(g_checks.lock);
        PyObject* seen = PyDict_GetItemWithError(g_checks.seen, device_key.ptr());  // borrowed
        py::object flag;
        if (seen) {
          flag = py::reinterpret_borrow<py::object>(seen);
        } else {
          if (PyErr_Occurred()) throw python_error();
          PyObject* nothing = PyObject_CallOneArg(g_checks.nothing_seen, device_key.ptr());
          if (!nothing) throw python_error();
          flag = py::reinterpret_steal<py::object>(nothing);
        }
        const Py_ssize_t n = PyTuple_GET_SIZE(values.ptr());
        operands = py::tuple(n + 1);
        for (Py_ssize_t i = 0; i < n; i++)
          PyTuple_SET_ITEM(operands.ptr(), i, py::reinterpret_borrow<py::object>(PyTuple_GET_ITEM(values.ptr(), i)).release().ptr());
        PyTuple_SET_ITEM(operands.ptr(), n, flag.release().ptr());
      }
      PyObject* description = nullptr;
      PyObject* out = recorder_.record(args, operands.ptr(), device, padded, &description);
      if (!out) {  // a call the recorder leaves to Python, or the call's own error: the Python kernel
        if (PyErr_Occurred() && PyErr_ExceptionMatches(PyExc_KeyboardInterrupt)) throw python_error();
        PyErr_Clear();
        return py::object();
      }
      result = py::reinterpret_steal<py::object>(out);
      traits = py::reinterpret_steal<py::object>(description);
      TORCH_CHECK(PyTuple_Check(traits.ptr()) && PyTuple_GET_SIZE(traits.ptr()) == 4, "pjrt: ", name_,
                  "'s signature has no (checks, appends, ints, grows_by) description");
      if (checked_) {
        PyObject* errors = PyTuple_GET_ITEM(traits.ptr(), 0);
        TORCH_CHECK(PyTuple_Check(result.ptr()) && PyTuple_GET_SIZE(result.ptr()) == 3, "pjrt: ", name_,
                    "'s checked call returned no (result, seen, findings)");
        PyObject* findings = PyTuple_GET_ITEM(result.ptr(), 2);
        TORCH_CHECK(PyTuple_GET_SIZE(findings) == PyTuple_GET_SIZE(errors), "pjrt: ", name_,
                    "'s index checks and their description disagree");
        if (PyDict_SetItem(g_checks.seen, device_key.ptr(), PyTuple_GET_ITEM(result.ptr(), 1)) < 0)
          throw python_error();
        for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(findings); k++) {
          PyObject* found = PyTuple_GET_ITEM(findings, k);  // (found, position, value)
          PyObject* error = PyTuple_GET_ITEM(errors, k);    // (exception factory, op)
          py::tuple entry = py::make_tuple(py::handle(PyTuple_GET_ITEM(found, 0)), py::handle(PyTuple_GET_ITEM(found, 1)),
                                           py::handle(PyTuple_GET_ITEM(found, 2)), py::handle(PyTuple_GET_ITEM(error, 0)),
                                           py::handle(PyTuple_GET_ITEM(error, 1)));
          if (PyList_Append(g_checks.queued, entry.ptr()) < 0) throw python_error();
        }
        over_bound = PyList_GET_SIZE(g_checks.queued) > g_checks.max_queued;
        result = py::reinterpret_borrow<py::object>(PyTuple_GET_ITEM(result.ptr(), 0));
      }
    }
    if (over_bound) {  // after the lock, which raise_pending takes
      PyObject* r = PyObject_CallNoArgs(g_checks.raise_pending);
      if (!r) throw python_error();
      Py_DECREF(r);
    }
    fast_calls_++;
    return result;
  }

  // One argument as the executable takes it; clears `fast` where the Python kernel must decide.
  // `written`: self of an in-place op.
  py::object operand(const c10::IValue& v, int kind, int& device, bool& fast, bool written, PaddedCall& padded) {
    if (kind == kTensorList) {  // each element as a tensor operand (a foreach op's lists)
      auto tensors = v.toTensorList();
      py::list out(tensors.size());
      for (size_t i = 0; i < tensors.size() && fast; i++) {
        py::object item = tensor_operand(tensors[i], device, fast, written, padded);
        if (fast) PyList_SET_ITEM(out.ptr(), i, item.release().ptr());
      }
      if (written && fast && shares_storage(tensors)) fast = false;  // CPU's order of writes: the Python kernel
      return out;
    }
    if (kind == kScalarList) {
      auto scalars = v.toListRef();
      py::list out(scalars.size());
      for (size_t i = 0; i < scalars.size() && fast; i++) {
        PyObject* s = scalars[i].isScalar() ? weak_scalar(scalars[i].toScalar()) : nullptr;
        if (!s) fast = false;
        else PyList_SET_ITEM(out.ptr(), i, py::reinterpret_borrow<py::object>(s).release().ptr());
      }
      return out;
    }
    if (kind == kScalar) {
      if (v.isNone()) return py::none();
      PyObject* s = v.isScalar() ? weak_scalar(v.toScalar()) : nullptr;
      if (!s) fast = false;
      return py::reinterpret_borrow<py::object>(s ? s : Py_None);
    }
    if (kind == kDevice) return device_operand(v, device, fast);
    if (kind != kTensor) return static_value(v, kind);
    if (v.isNone()) return py::none();
    return tensor_operand(v.toTensor(), device, fast, written, padded);
  }

  // A wrapped number's value, read from its CPU memory (item() would dispatch _local_scalar_dense).
  static c10::Scalar wrapped_value(const at::Tensor& t) {
    switch (t.scalar_type()) {
      case at::kDouble:
        return *static_cast<const double*>(t.const_data_ptr());
      case at::kLong:
        return *static_cast<const int64_t*>(t.const_data_ptr());
      case at::kBool:
        return *static_cast<const bool*>(t.const_data_ptr());
      default:
        return t.item();
    }
  }

  // The largest finite value of a floating dtype (0 for any other dtype).
  static double largest_float(c10::ScalarType dtype) {
    switch (dtype) {
      case at::kDouble: return std::numeric_limits<double>::max();
      case at::kFloat: return std::numeric_limits<float>::max();
      case at::kHalf: return static_cast<double>(std::numeric_limits<c10::Half>::max());
      case at::kBFloat16: return static_cast<double>(std::numeric_limits<c10::BFloat16>::max());
      default: return 0;
    }
  }

  // Whether each checked Scalar converts to the result's dtype as CPU's own `full` converts it
  // ("value cannot be converted to type int8_t without overflow"); as eager/kernels._fits_as_cpu.
  bool scalar_fits(c10::ArrayRef<c10::IValue> args) const {
    // The dtypes each value must fit: the dtype argument, else the first tensor's, else each of the
    // first tensor list's (a foreach op converts its Scalar to each tensor's dtype); none given:
    // `full` infers it from the value (a float: the default dtype).
    const c10::TensorOptions cpu = at::TensorOptions().device(at::kCPU);
    c10::SmallVector<c10::TensorOptions, 2> targets;
    if (dtype_at_ >= 0 && !args[dtype_at_].isNone()) {
      targets.push_back(cpu.dtype(args[dtype_at_].toScalarType()));
    } else if (tensor_at_ >= 0 && args[tensor_at_].isTensor()) {
      targets.push_back(cpu.dtype(args[tensor_at_].toTensor().scalar_type()));
    } else if (tensor_at_ >= 0 && args[tensor_at_].isTensorList()) {
      for (const at::Tensor& t : args[tensor_at_].toTensorList())
        if (targets.empty() || targets.back().dtype() != t.dtype()) targets.push_back(cpu.dtype(t.scalar_type()));
    }
    if (targets.empty()) targets.push_back(cpu);
    for (int at : checked_scalars_) {
      const c10::IValue& value = args[at];
      if (!value.isScalar()) continue;
      const c10::Scalar scalar = value.toScalar();
      // 0..127 fits every dtype (torch.ones' fill_(1), add's alpha): no CPU tensor for the common values
      if (scalar.isIntegral(true) && scalar.toDouble() >= 0 && scalar.toDouble() <= 127) continue;
      for (const c10::TensorOptions& options : targets) {
        // a real number into a floating dtype (an optimizer's alpha, an activation's slope): the
        // range test CPU's conversion makes (inf and NaN pass)
        if (options.has_dtype() && scalar.isFloatingPoint()) {
          const double largest = largest_float(options.dtype().toScalarType());
          const double v = scalar.toDouble();
          if (largest > 0 && !(std::isfinite(v) && std::abs(v) > largest)) continue;
        }
        try {
          at::full({0}, scalar, options);
        } catch (const std::exception&) {  // c10::Error, or c10::report_overflow's std::runtime_error
          return false;
        }
      }
    }
    return true;
  }

  // Whether an argument after self (an in-place op's written tensor) is, or holds, a tensor over
  // self's storage.
  static bool reads_written_storage(c10::ArrayRef<c10::IValue> args) {
    if (!args[0].isTensor()) return false;  // a foreach op_'s list: shares_storage checks the list itself
    const c10::StorageImpl* written = args[0].toTensor().storage().unsafeGetStorageImpl();
    auto over = [written](const at::Tensor& t) {
      return t.defined() && t.has_storage() && t.storage().unsafeGetStorageImpl() == written;
    };
    for (size_t i = 1; i < args.size(); i++) {
      if (args[i].isTensor() && over(args[i].toTensor())) return true;
      if (args[i].isTensorList())
        for (const at::Tensor& t : args[i].toTensorList())
          if (over(t)) return true;
    }
    return false;
  }

  // Whether two tensors of a foreach op_'s self share a storage (one tensor twice, two views of one
  // storage): CPU applies the op tensor by tensor, and a later tensor sees an earlier one's write.
  static bool shares_storage(const c10::List<at::Tensor>& tensors) {
    std::vector<const void*> storages;
    storages.reserve(tensors.size());
    for (const at::Tensor& t : tensors) storages.push_back(t.storage().unsafeGetStorageImpl());
    std::sort(storages.begin(), storages.end());
    return std::adjacent_find(storages.begin(), storages.end()) != storages.end();
  }

  // The device argument as the executable keys on it (a torch.device, as the Python kernel
  // passes it); a pjrt device other than the operands' is the Python kernel's to decide.
  py::object device_operand(const c10::IValue& v, int& device, bool& fast) {
    if (v.isNone()) return py::none();
    c10::Device d = v.toDevice();
    int index = d.has_index() ? d.index() : g_current_device;
    if (d.type() != kPjrt || index >= g_device_count || (device >= 0 && device != index)) {
      fast = false;
      return py::none();
    }
    device = index;
    return static_value(v, kStatic);
  }

  py::object tensor_operand(const at::Tensor& t, int& device, bool& fast, bool written, PaddedCall& padded) {
    if (!t.defined()) return py::none();
    if (t.device().type() == kPjrt) {
      int index = t.device().index();
      if (device >= 0 && device != index) {
        fast = false;  // the Python kernel raises the device-mismatch error
        return py::none();
      }
      device = index;
      Holder* h = holder_of(t.storage());
      settle(h);
      if (grows_ && h && h->buffer && Py_TYPE(h->buffer) == reinterpret_cast<PyTypeObject*>(g_growth.padded_type) &&
          !h->appended && is_whole_buffer(t, h))
        return padded_operand(h->buffer, fast, padded);
      if (grows_ && h && (h->appended || (h->buffer && !is_pending(h->buffer) &&
                                          Py_TYPE(h->buffer) != reinterpret_cast<PyTypeObject*>(g_eager.array_type)))) {
        fast = false;  // a growing storage (an append's first result, or a view of a padded one): the Python kernel
        return py::none();
      }
      if (is_whole_buffer(t, h)) return py::reinterpret_borrow<py::object>(h->buffer);
      if (written && !is_whole_storage(t, h)) {  // an in-place write through a view: the Python kernel checks overlaps
        fast = false;
        return py::none();
      }
      return lazy_view(t, h);
    }
    if (t.unsafeGetTensorImpl()->is_wrapped_number()) {  // a Python number: promotes as a Scalar
      PyObject* s = weak_scalar(wrapped_value(t));
      if (s) return py::reinterpret_borrow<py::object>(s);
    }
    fast = false;  // CPU tensors: the Python kernel allows scalars and raises for the rest
    return py::none();
  }

  // A padded storage's buffer (storage.Padded) as the lowering of an op that grows takes it: a
  // PaddedOperand of its array and its length as a traced scalar. Several in one call (attention's
  // keys and values) have one length and capacity; others are the Python kernel's (it runs such
  // calls at exact sizes).
  py::object padded_operand(PyObject* buffer, bool& fast, PaddedCall& padded) {
    py::object array = attr(buffer, g_growth.array), axis = attr(buffer, g_growth.axis);
    py::object length = attr(buffer, g_growth.length);
    const int64_t n = length.cast<int64_t>();
    const int64_t capacity = array_type(array).shape.at(axis.cast<size_t>());
    if (padded.length >= 0 && (padded.length != n || padded.capacity != capacity)) {
      fast = false;
      return py::none();
    }
    padded.length = n;
    padded.capacity = capacity;
    PyObject* traced = PyObject_CallOneArg(g_growth.offset_operand, length.ptr());
    if (!traced) throw python_error();
    return new_slotted(g_growth.padded_operand_type,
                       {{g_growth.array, array.ptr()}, {g_growth.axis, axis.ptr()},
                        {g_growth.length, py::reinterpret_steal<py::object>(traced).ptr()}});
  }

  // An append's padded result (the lowering's PaddedOperand: its array and its traced length) as a
  // tensor of the exact length `length` over a storage.Padded buffer, as storage.wrap makes it.
  at::Tensor wrap_padded(const py::object& result, int64_t length, c10::DeviceIndex device) {
    TORCH_CHECK(Py_TYPE(result.ptr()) == reinterpret_cast<PyTypeObject*>(g_growth.padded_operand_type),
                "pjrt: the lowering of ", name_, " returned no padded result for a padded operand");
    py::object array = attr(result.ptr(), g_growth.array), axis = attr(result.ptr(), g_growth.axis);
    const ArrayType& type = array_type(array);
    std::vector<int64_t> shape = type.shape;
    shape.at(axis.cast<size_t>()) = length;
    if (!is_pending(array.ptr())) record(array.ptr());
    py::object buffer = new_slotted(g_growth.padded_type, {{g_growth.array, array.ptr()}, {g_growth.axis, axis.ptr()},
                                                            {g_growth.length, py::int_(length).ptr()}});
    return wrap(std::move(buffer), std::move(shape), type.dtype, device);
  }

  at::Tensor wrap_result(const c10::OperatorHandle& op, PyObject* array, c10::DeviceIndex device) {
    if (array == Py_None) return at::Tensor();  // an output the op leaves undefined
    if (is_pending(array)) return wrap_array(py::reinterpret_borrow<py::object>(array), device);
    if (Py_TYPE(array) != reinterpret_cast<PyTypeObject*>(g_eager.array_type)) {
      // a storage.Permuted (an output laid out by torch's strides): wrap its physical array, permute the view
      py::object permuted = py::reinterpret_borrow<py::object>(array);
      py::object physical = permuted.attr("array");
      bool pending = is_pending(physical.ptr());
      TORCH_CHECK(pending || Py_TYPE(physical.ptr()) == reinterpret_cast<PyTypeObject*>(g_eager.array_type),
                  "pjrt: the lowering of ", op.schema().operator_name(), " returned a ", Py_TYPE(array)->tp_name,
                  " instead of a jax array");
      if (!pending) record(physical.ptr());
      std::vector<int64_t> dims;
      for (auto d : permuted.attr("inverse")) dims.push_back(d.cast<int64_t>());
      return wrap_array(physical, device).permute(dims);
    }
    record(array);
    return wrap_array(py::reinterpret_borrow<py::object>(array), device);
  }

  void store(const at::Tensor& self, const py::object& result) {
    if (!store_whole(self, result)) store_in_python(self, result);
  }

  void store_in_python(const at::Tensor& self, const py::object& result) {
    PyObject* out = PyObject_CallFunctionObjArgs(store_, py::cast(self).ptr(), result.ptr(), nullptr);
    if (!out) throw python_error();
    Py_DECREF(out);
  }

  // `traits` (a described kernel's): its int returns, and whether the result is an append's
  void push_results(const c10::OperatorHandle& op, torch::jit::Stack* stack, const py::object& result,
                    c10::DeviceIndex device, const py::object& traits, const PaddedCall& padded) {
    PyObject* ints = traits ? PyTuple_GET_ITEM(traits.ptr(), 2) : nullptr;
    py::tuple call_ints;
    if (padded.length >= 0) {  // recorded only where its traits say how it grows (recorder.cpp)
      if (Py_TYPE(result.ptr()) == reinterpret_cast<PyTypeObject*>(g_growth.padded_operand_type)) {  // an append
        const int64_t length = padded.length + PyLong_AsLongLong(PyTuple_GET_ITEM(traits.ptr(), 3));
        torch::jit::push(*stack, wrap_padded(result, length, device));
        return;
      }
      // an exact result (attention over a cache): int returns that are the operands' length take this call's
      call_ints = py::tuple(PyTuple_GET_SIZE(ints));
      for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(ints); i++) {
        PyObject* value = PyTuple_GET_ITEM(ints, i);
        call_ints[i] = value == Py_None ? py::int_(padded.length) : py::reinterpret_borrow<py::object>(value);
      }
      ints = call_ints.ptr();
    }
    push_returns(op, stack, result.ptr(), [&](PyObject* array) { return wrap_result(op, array, device); }, ints);
    if (traits && PyTuple_GET_ITEM(traits.ptr(), 1) == Py_True) {
      const at::Tensor& appended = stack->back().toTensor();  // an append has one return
      holder_of(appended.storage())->appended = true;
    }
  }

  // The op's returns from `result` (the value itself for one return, else one item per return),
  // each tensor made by `tensor` (a Tensor[] return: a sequence of them); int returns from `ints`
  // (a tuple, in order) where given, else Python ints in `result`.
  template <typename ToTensor>
  static void push_returns(const c10::OperatorHandle& op, torch::jit::Stack* stack, PyObject* result,
                           ToTensor tensor, PyObject* ints = nullptr) {
    const auto& returns = op.schema().returns();
    Py_ssize_t next_int = 0;
    auto one = [&](size_t i, PyObject* value) -> c10::IValue {
      auto kind = returns[i].type()->kind();
      if (kind == c10::TypeKind::IntType || kind == c10::TypeKind::SymIntType) {  // from `ints`, else the result's
        PyObject* number = !ints ? value : next_int < PyTuple_GET_SIZE(ints) ? PyTuple_GET_ITEM(ints, next_int++) : nullptr;
        TORCH_CHECK(number && PyLong_Check(number), "pjrt: no int for ", op.schema().operator_name(), "'s return ", i);
        return c10::IValue(int64_t(PyLong_AsLongLong(number)));
      }
      if (kind != c10::TypeKind::ListType) return tensor(value);
      c10::List<at::Tensor> list;  // a Tensor[] return (foreach ops)
      for (auto item : py::reinterpret_borrow<py::object>(value)) list.push_back(tensor(item.ptr()));
      return list;
    };
    if (returns.empty()) return;  // a foreach op_
    if (returns.size() == 1) {
      torch::jit::push(*stack, one(0, result));
      return;
    }
    size_t i = 0;
    for (auto item : py::reinterpret_borrow<py::object>(result)) torch::jit::push(*stack, one(i++, item.ptr()));
  }

  // The Python kernel with the arguments as Python objects (all positional: it binds by schema order).
  void slow(const c10::OperatorHandle& op, torch::jit::Stack* stack, size_t n) {
    slow_calls_++;
    auto args = torch::jit::last(*stack, n);
    py::tuple values(n);
    for (size_t i = 0; i < n; i++) {
      py::object value = (kinds_[i] == kTensor || kinds_[i] == kScalar || kinds_[i] == kTensorList ||
                          kinds_[i] == kScalarList)
                             ? torch::jit::toPyObject(args[i])
                             : static_value(args[i], kinds_[i]);
      PyTuple_SET_ITEM(values.ptr(), i, value.release().ptr());
    }
    torch::jit::drop(*stack, n);
    PyObject* out = PyObject_Call(slow_, values.ptr(), nullptr);
    if (!out) throw python_error();
    py::object result = py::reinterpret_steal<py::object>(out);
    push_returns(op, stack, result.ptr(), [&](PyObject* obj) { return unpack(op, obj); });
  }

  static at::Tensor unpack(const c10::OperatorHandle& op, PyObject* obj) {
    if (obj == Py_None) return at::Tensor();
    TORCH_CHECK(THPVariable_Check(obj), "pjrt: the kernel of ", op.schema().operator_name(), " returned a ",
                Py_TYPE(obj)->tp_name, " instead of a tensor");
    return THPVariable_Unpack(obj);
  }

  PyObject* run_;   // the op's executable (never freed: kernels live as long as the process)
  PyObject* recorded_;  // fused mode: the op's fused.Recordable
  PyObject* slow_;  // the op's Python kernel
  PyObject* store_;  // in-place ops: storage write of a result into self
  std::vector<int> kinds_;
  std::vector<int> checked_scalars_;  // scalar_fits' arguments
  int dtype_at_ = -1, tensor_at_ = -1;  // where scalar_fits finds the result's dtype (-1: none): a tensor or a list
  bool described_;  // see the constructor
  bool checked_;
  bool grows_;
  bool has_operands_ = false;  // tensor operands say where the call runs; a factory's device argument alone

 public:
  CallRecorder recorder_;  // fused mode's recorder of this kernel's calls
};

// Whether `t`'s strides are row-major ones (size-1 dims aside). An empty tensor is "contiguous"
// whatever its strides, and a copy keeps them (a channels_last batch of 0), so is_contiguous()
// does not say.
static bool row_major_strides(const at::Tensor& t) {
  int64_t expected = 1;
  for (int64_t d = t.dim() - 1; d >= 0; --d) {
    if (t.size(d) != 1 && t.stride(d) != expected) return false;
    expected *= std::max<int64_t>(t.size(d), 1);
  }
  return true;
}

// Whether a copy of `self` in `format` (clone's, _to_copy's memory_format) is row-major:
// contiguous_format, or preserve_format (the default) of a row-major tensor.
static bool copies_row_major(const at::Tensor& self, std::optional<c10::MemoryFormat> format) {
  return format && *format != c10::MemoryFormat::Preserve ? *format == c10::MemoryFormat::Contiguous
                                                          : self.numel() > 0 ? self.is_contiguous()
                                                                             : row_major_strides(self);
}

// aten::clone of a pjrt tensor whose copy is row-major (contiguous_format, or preserve_format of
// a contiguous tensor): its storage's buffer when the tensor is exactly that buffer (buffers are
// immutable, so the copy shares it until one of them is written), else its view read by
// storage's read-view executable (`run`; `recorded` in fused mode). Other layouts, and any call
// this kernel cannot serve, go to transfer.clone.
class CloneKernel : public FastKernel {
 public:
  using FastKernel::FastKernel;

  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
    auto args = torch::jit::last(*stack, 2);
    const at::Tensor& self = args[0].toTensor();
    bool row_major = copies_row_major(self, args[1].toOptional<c10::MemoryFormat>());
    py::gil_scoped_acquire gil;
    safe_point();
    Holder* h = self.device().type() == kPjrt ? holder_of(self.storage()) : nullptr;
    if (!row_major || !h) return slow(op, stack, 2);
    settle(h);
    if (!h->buffer) return slow(op, stack, 2);
    py::object value;
    if (!is_whole_buffer(self, h)) {
      py::object no_traits;
      value = call(args.data(), py::make_tuple(lazy_view(self, h)), self.device().index(), no_traits);
      if (!value) return slow(op, stack, 2);
    } else if (is_pending(h->buffer) || Py_TYPE(h->buffer) == reinterpret_cast<PyTypeObject*>(g_eager.array_type)) {
      value = py::reinterpret_borrow<py::object>(h->buffer);
      fast_calls_++;
    } else {
      return slow(op, stack, 2);  // a growing storage's Padded buffer: storage.wrap keeps it padded
    }
    torch::jit::drop(*stack, 2);
    torch::jit::push(*stack, wrap_result(op, value.ptr(), self.device().index()));
  }
};

// aten::_to_copy of a pjrt tensor to its own device (a dtype conversion, or a copy) whose result
// is row-major (contiguous_format, or preserve_format of a contiguous tensor): the op table's
// `_to_copy` lowering, run or recorded like any table op. A row-major copy between the host and
// pjrt in the same dtype (a batch's upload, a result read back): served here too (`download`,
// `upload`). Copies between pjrt devices, other layouts, pinned memory and any call the fast
// path cannot serve go to transfer.to_copy.
class ToCopyKernel : public FastKernel {
 public:
  using FastKernel::FastKernel;

  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
    // self, dtype, layout, device, pin_memory, non_blocking, memory_format
    auto args = torch::jit::last(*stack, 7);
    const at::Tensor& self = args[0].toTensor();
    auto dtype = args[1].toOptional<at::ScalarType>();
    auto layout = args[2].toOptional<c10::Layout>();
    auto device = args[3].toOptional<c10::Device>();
    const bool row_major = copies_row_major(self, args[6].toOptional<c10::MemoryFormat>()) &&
                           (!layout || *layout == c10::kStrided) && !args[4].toOptional<bool>().value_or(false);
    const bool same_dtype = !dtype || *dtype == self.scalar_type();
    if (row_major && same_dtype && device && self.device().type() == kPjrt && device->is_cpu() && download(self, stack))
      return;
    if (row_major && same_dtype && device && self.device().is_cpu() && device->type() == kPjrt &&
        upload(self, device->has_index() ? device->index() : c10::DeviceIndex(g_current_device), args[5].toBool(),
               stack))
      return;
    if (!row_major || self.device().type() != kPjrt || (device && device->type() != kPjrt)) {
      py::gil_scoped_acquire gil;
      safe_point();  // a copy between devices (FastKernel's entry is the others' safe point)
      return slow(op, stack, 7);
    }
    FastKernel::operator()(op, keys, stack);
  }

 private:
  // self (a whole storage's buffer) read back to a new host tensor: a host sync, as
  // storage.download's (this thread's region runs, then queued index checks raise).
  bool download(const at::Tensor& self, torch::jit::Stack* stack) {
    py::gil_scoped_acquire gil;
    safe_point();
    Holder* h = holder_of(self.storage());
    settle(h);
    if (!is_whole_buffer(self, h) || !(is_pending(h->buffer) || is_array(h->buffer))) return false;
    py::object value = py::reinterpret_borrow<py::object>(h->buffer);
    flush_region(nullptr);
    raise_pending_index_checks();
    if (is_pending(value.ptr())) value = pending_value(value.ptr());
    if (!value) return false;  // its region failed: the Python kernel raises that
    at::Tensor out = at::empty(self.sizes(), self.options().device(c10::kCPU));
    copy_to_host(value, out);
    fast_calls_++;
    torch::jit::drop(*stack, 7);
    torch::jit::push(*stack, std::move(out));
    return true;
  }

  // A host tensor uploaded to pjrt:`index` (storage.upload's work: the CPU client aliases host
  // memory, so it gets a copy of its own; another client copies, and waits unless non_blocking).
  bool upload(const at::Tensor& self, c10::DeviceIndex index, bool non_blocking, torch::jit::Stack* stack) {
    if (!g_transfer.put || index < 0 || index >= g_device_count || self.is_conj() || self.is_neg() || self._is_zerotensor() ||
        !transfer_dtype(self.scalar_type()))
      return false;
    py::gil_scoped_acquire gil;
    safe_point();
    const DeviceFacts& facts = device_facts(index, self.scalar_type());
    if (!facts.holds_dtype) return false;  // the Python kernel raises platform.check_dtype's error
    at::Tensor host = facts.aliases_host ? self.clone(c10::MemoryFormat::Contiguous) : self.contiguous();
    // (not the tensor's Python object: a subclass may override .numpy)
    PyObject* host_array = torch::utils::tensor_to_numpy(host.detach(), /*force=*/false);
    if (!host_array) throw python_error();
    py::object numpy = py::reinterpret_steal<py::object>(host_array);
    PyObject* array = PyObject_CallFunctionObjArgs(g_transfer.put, numpy.ptr(), py::int_(index).ptr(), nullptr);
    if (!array) throw python_error();
    py::object value = py::reinterpret_steal<py::object>(array);
    if (!facts.aliases_host && !non_blocking) value.attr("block_until_ready")();
    record(value.ptr());
    fast_calls_++;
    torch::jit::drop(*stack, 7);
    torch::jit::push(*stack, wrap_array(std::move(value), index));
    return true;
  }

  // dtypes whose host tensors numpy() takes as they are (storage.to_numpy goes through bits for
  // bfloat16 and float8)
  static bool transfer_dtype(at::ScalarType t) {
    return t != at::kBFloat16 && !at::isFloat8Type(t) && t != at::kComplexHalf && !at::isQIntType(t) &&
           !at::isBitsType(t) && !at::isBarebonesUnsignedType(t);
  }

  struct DeviceFacts {
    bool aliases_host = false;  // the CPU client: device_put of numpy memory aliases it
    bool holds_dtype = false;   // platform.check_dtype passes
  };
  // (device, dtype) -> its facts, asked of Python once
  const DeviceFacts& device_facts(c10::DeviceIndex index, at::ScalarType dtype) {
    const int key = int(index) * 256 + int(dtype);
    auto found = facts_.find(key);
    if (found != facts_.end()) return found->second;
    DeviceFacts facts;
    py::object answer = py::reinterpret_borrow<py::object>(g_transfer.facts)(
        int(index), py::handle(reinterpret_cast<PyObject*>(torch::getTHPDtype(dtype))));
    facts.aliases_host = answer[py::int_(0)].cast<bool>();
    facts.holds_dtype = answer[py::int_(1)].cast<bool>();
    return facts_.emplace(key, facts).first->second;
  }
  std::unordered_map<int, DeviceFacts> facts_;

  // `value`'s elements (row-major) into `out`
  static void copy_to_host(const py::object& value, const at::Tensor& out) {
    Py_buffer view;
    py::object host = host_bytes(value, &view);
    std::unique_ptr<Py_buffer, void (*)(Py_buffer*)> release(&view, PyBuffer_Release);
    TORCH_CHECK(size_t(view.len) == out.nbytes(), "pjrt: a host read got ", view.len, " bytes for ", out.nbytes());
    if (view.len) std::memcpy(out.data_ptr(), view.buf, size_t(view.len));
  }
};

// aten::_local_scalar_dense (item(), int(t), float(t)) of a pjrt tensor over a storage of at most
// `max_elements` elements of its own dtype (a token, a loss): the storage's array read on the
// host (its region run first where it is pending) and the element taken there, with no executable
// for the view. The queued index checks are raised first, as at every host sync. Other calls (a
// large storage reads its element's view on the device, a reinterpreted dtype, lazy conj/neg
// bits, a padded storage) go to transfer.local_scalar_dense.
class ScalarReadKernel : public FastKernel {
 public:
  ScalarReadKernel(py::object slow, int64_t max_elements)
      : FastKernel("aten::_local_scalar_dense", py::none(), py::none(), std::move(slow), py::none(), {kTensor}),
        max_elements_(max_elements) {}

  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
    const at::Tensor self = stack->back().toTensor();
    py::gil_scoped_acquire gil;
    safe_point();
    Holder* h = self.device().type() == kPjrt ? holder_of(self.storage()) : nullptr;
    settle(h);
    if (!h || !h->buffer || self.scalar_type() != h->dtype || self.is_conj() || self.is_neg() ||
        c10::multiply_integers(h->shape) > max_elements_ || !(is_pending(h->buffer) || is_array(h->buffer)))
      return slow_read(stack);
    raise_pending_index_checks();  // a host sync: an earlier call's out-of-range index raises here
    if (is_pending(h->buffer) && !pending_value(h->buffer)) return slow_read(stack);  // its region failed
    settle(h);  // (another thread may have given the storage a new buffer while the region ran)
    if (!is_array(h->buffer)) return slow_read(stack);
    py::object array = py::reinterpret_borrow<py::object>(h->buffer);
    c10::Scalar value = element(array, self);
    fast_calls_++;
    stack->pop_back();
    torch::jit::push(*stack, value);
  }

 private:
  // The element at self's storage offset of `array` (the whole storage, row-major) copied to the host.
  static c10::Scalar element(const py::object& array, const at::Tensor& self) {
    Py_buffer view;
    py::object host = host_bytes(array, &view);
    const int64_t offset = self.storage_offset() * int64_t(self.element_size());
    std::unique_ptr<Py_buffer, void (*)(Py_buffer*)> release(&view, PyBuffer_Release);
    TORCH_CHECK(offset + int64_t(self.element_size()) <= int64_t(view.len), "pjrt: element ", self.storage_offset(),
                " lies outside its storage's array (", view.len, " bytes)");
    return at::from_blob(static_cast<char*>(view.buf) + offset, {}, self.options().device(at::kCPU)).item();
  }

  // transfer.local_scalar_dense, which returns a Python number
  void slow_read(torch::jit::Stack* stack) {
    slow_calls_++;
    py::object self = torch::jit::toPyObject(stack->back());
    stack->pop_back();
    PyObject* out = PyObject_CallOneArg(slow_, self.ptr());
    if (!out) throw python_error();
    py::object number = py::reinterpret_steal<py::object>(out);
    c10::Scalar value;
    if (PyBool_Check(out)) {
      value = c10::Scalar(out == Py_True);
    } else if (PyLong_Check(out)) {  // a uint64 past int64's range stays unsigned
      int overflow = 0;
      const long long v = PyLong_AsLongLongAndOverflow(out, &overflow);
      if (overflow > 0) {
        const unsigned long long u = PyLong_AsUnsignedLongLong(out);
        if (PyErr_Occurred()) throw python_error();
        value = c10::Scalar(uint64_t(u));
      } else {
        if (overflow < 0 || PyErr_Occurred()) throw python_error();
        value = c10::Scalar(int64_t(v));
      }
    } else if (PyFloat_Check(out)) {
      value = c10::Scalar(PyFloat_AS_DOUBLE(out));
    } else if (PyComplex_Check(out)) {
      value = c10::Scalar(c10::complex<double>(PyComplex_RealAsDouble(out), PyComplex_ImagAsDouble(out)));
    } else {
      TORCH_CHECK(false, "pjrt: _local_scalar_dense's kernel returned a ", Py_TYPE(out)->tp_name, ", not a number");
    }
    torch::jit::push(*stack, value);
  }

  int64_t max_elements_;
};

static std::map<std::string, std::unique_ptr<torch::Library>> g_fast_libraries;  // by op namespace
static std::vector<FastKernel*> g_fast_kernels;  // owned by their libraries' registrations

void set_eager_helpers(py::object weak_scalar, py::object read_lazily, py::object record, py::object array_type,
                       py::object strided_view, py::object record_call, py::object pending_type,
                       py::dict torch_to_jax) {
  g_eager = {weak_scalar.release().ptr(), read_lazily.release().ptr(), record.release().ptr(),
             array_type.release().ptr(), strided_view.release().ptr(), record_call.release().ptr()};
  g_pending_type = pending_type.release().ptr();
  g_pending = {Slot::of(g_pending_type, "aval"), Slot::of(g_pending_type, "value"), Slot::of(g_pending_type, "region"),
               Slot::of(g_pending_type, "slot"), Slot::of(g_pending_type, "replaces")};
  for (auto [torch_dtype, jax_dtype] : torch_to_jax) {
    auto index = static_cast<size_t>(reinterpret_cast<THPDtype*>(torch_dtype.ptr())->scalar_type);
    if (index < g_eager.jax_dtypes.size()) g_eager.jax_dtypes[index] = jax_dtype.inc_ref().ptr();
  }
}

void set_fused(bool fused) { g_fused = fused; }

void set_growth_helpers(py::object padded_type, py::object padded_operand_type, py::object offset_operand) {
  auto name = [](const char* s) { return PyUnicode_InternFromString(s); };
  g_growth = {padded_type.release().ptr(), padded_operand_type.release().ptr(), offset_operand.release().ptr(),
              name("array"), name("axis"), name("length")};
}

void set_index_check_helpers(py::object lock, py::dict seen, py::list queued, py::object nothing_seen,
                             py::object raise_pending, py::object raise_if_found, Py_ssize_t max_queued) {
  g_checks = {lock.release().ptr(), seen.release().ptr(), queued.release().ptr(), nothing_seen.release().ptr(),
              raise_pending.release().ptr(), raise_if_found.release().ptr(), max_queued};
}

// Register `kernel` as the PrivateUse1 kernel of `ns`::`name` (e.g. "aten", "add.Tensor").
template <typename Kernel>
static void register_kernel(const std::string& ns, const std::string& name, std::unique_ptr<Kernel> kernel) {
  auto& library = g_fast_libraries[ns];
  if (!library) {
    library = std::make_unique<torch::Library>(torch::Library::IMPL, ns, c10::DispatchKey::PrivateUse1, __FILE__,
                                               __LINE__);
  }
  g_fast_kernels.push_back(kernel.get());
  library->impl(name.c_str(), torch::CppFunction::makeFromBoxedFunctor(std::move(kernel)));
}

void register_fast_kernel(const std::string& ns, const std::string& name, py::object run, py::object recorded,
                          py::object slow, py::object store, std::vector<int> kinds, bool described, bool checked,
                          bool grows) {
  register_kernel(ns, name, std::make_unique<FastKernel>(ns + "::" + name, run, recorded, slow, store, std::move(kinds),
                                                         described, checked, grows));
}

void register_clone_kernel(py::object read_view, py::object recorded_read_view, py::object slow) {
  register_kernel("aten", "clone", std::make_unique<CloneKernel>("aten::clone", read_view, recorded_read_view, slow,
                                                                 py::none(), std::vector<int>{kTensor, kMemoryFormat}));
}

void set_transfer_helpers(py::object put, py::object facts) {
  g_transfer = {put.release().ptr(), facts.release().ptr()};
}

void register_to_copy_kernel(py::object run, py::object recorded, py::object slow, std::vector<int> kinds) {
  register_kernel("aten", "_to_copy", std::make_unique<ToCopyKernel>("aten::_to_copy", run, recorded, slow, py::none(),
                                                                     std::move(kinds)));
}

void register_scalar_read_kernel(py::object slow, int64_t max_elements) {
  register_kernel("aten", "_local_scalar_dense", std::make_unique<ScalarReadKernel>(slow, max_elements));
}

void set_safe_point(py::dict budget_state, py::object release_if_due, py::object check_default_dtype) {
  g_budget_state = budget_state.release().ptr();
  g_budget_release = release_if_due.release().ptr();
  g_check_default_dtype = check_default_dtype.release().ptr();
  g_traced_default_dtype = c10::get_default_dtype();
  g_due = PyUnicode_InternFromString("due");
}

py::dict fast_path_counts() {
  py::dict counts;
  for (FastKernel* k : g_fast_kernels)
    if (k->fast_calls_ || k->slow_calls_)
      counts[py::str(k->name_)] = py::make_tuple(k->fast_calls_, k->slow_calls_, k->recorder_.recorded);
  return counts;
}

void reset_fast_path_counts() {
  for (FastKernel* k : g_fast_kernels) k->fast_calls_ = k->slow_calls_ = k->recorder_.recorded = 0;
}

// ---------------------------------------------------------------------------
// scaled_dot_product_attention's backend choice for pjrt tensors
// ---------------------------------------------------------------------------
// torch's SDPA asks `_fused_sdp_choice_stub` which backend serves the query's device, and a
// PrivateUse1 backend can only register that stub from C++. The rule is here, asked once per SDPA
// call, so it costs no Python: "overrideable" routes the call to
// `aten._scaled_dot_product_fused_attention_overrideable` (torch_pjrt/kernels/sdpa.py's lowerings,
// and its `_backward` for autograd); torch's math path (a decomposition into table ops) serves
// what those do not (dropout, inputs the math path refuses with torch's own errors, symbolic sizes
// under dynamic=True, whose ops the compiler knows how to pad) and `sdpa_kernel(SDPBackend.MATH)`.
// Only context parallelism needs Python: while torch's context_parallel() is on
// (kernels/sdpa.py's `ring_attention_active`), SDPA takes the efficient-attention op, which
// DTensor's ring attention handles.
static PyObject* g_ring_attention_active = nullptr;

static bool ring_attention_active() {
  if (!g_ring_attention_active) return false;
  py::gil_scoped_acquire gil;
  // context_parallel lives in torch.distributed.tensor: until that is imported it cannot be on
  if (!PyDict_GetItemString(PyImport_GetModuleDict(), "torch.distributed.tensor")) return false;
  return py::reinterpret_borrow<py::function>(g_ring_attention_active)().cast<bool>();
}

int64_t sdp_choice(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                   const std::optional<at::Tensor>& attn_mask, double dropout_p, bool is_causal,
                   std::optional<double> scale, bool enable_gqa) {
  auto& ctx = at::globalContext();
  const int64_t math = static_cast<int64_t>(ctx.userEnabledMathSDP() ? at::SDPBackend::math : at::SDPBackend::error);
  for (const at::Tensor* t : {&query, &key, &value})
    if (t->unsafeGetTensorImpl()->has_symbolic_sizes_strides()) return math;
  const int64_t dims = query.dim();
  // mismatched heads without enable_gqa: the math path raises torch's own error
  bool heads_ok = dims < 3 || key.dim() < 3 || query.size(-3) == key.size(-3) ||
                  (enable_gqa && dims == key.dim() && dims == value.dim() && key.size(-3) == value.size(-3) &&
                   key.size(-3) > 0 && query.size(-3) % key.size(-3) == 0);
  bool shapes_ok = dims >= 2 && key.dim() == dims && value.dim() == dims && query.size(-1) == key.size(-1) &&
                   key.size(-2) == value.size(-2) &&
                   query.sizes().slice(0, std::max<int64_t>(dims - 3, 0)) ==
                       key.sizes().slice(0, std::max<int64_t>(dims - 3, 0)) &&
                   query.scalar_type() == key.scalar_type() && query.scalar_type() == value.scalar_type() &&
                   query.is_floating_point() &&
                   (!attn_mask || !attn_mask->defined() || attn_mask->scalar_type() == at::kBool ||
                    attn_mask->scalar_type() == query.scalar_type());
  if (!heads_ok || !shapes_ok || dropout_p != 0.0) return math;
  if (ctx.userEnabledMemEfficientSDP() && (!ctx.userEnabledOverrideableSDP() || ring_attention_active()))
    return static_cast<int64_t>(at::SDPBackend::efficient_attention);
  if (ctx.userEnabledOverrideableSDP()) return static_cast<int64_t>(at::SDPBackend::overrideable);
  return math;
}

void set_ring_attention_active(py::function active) {
  Py_XDECREF(g_ring_attention_active);
  g_ring_attention_active = active.release().ptr();
}

}  // namespace torch_pjrt

namespace at::native {
REGISTER_PRIVATEUSE1_DISPATCH(_fused_sdp_choice_stub, &torch_pjrt::sdp_choice);
}
