// The Python module: what torch_pjrt's Python code calls (storage.py, device.py, eager/,
// kernels/sdpa.py, __init__.py), and the runtime's calls into Python. A storage's JAX
// buffer as storage.py and the eager fast path see it lives here: the Holder
// (allocator.cpp) owns the buffer; a tensor is a view of it. One unit for all of it, as
// each unit that includes torch's pybind casters costs seconds of build time.
#include "bindings.h"
#include <structmember.h>  // T_OBJECT_EX: a __slots__ member

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/Generator.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/version.h>

namespace torch_pjrt {

namespace {

PyObject* g_synchronize = nullptr;        // storage.synchronize(device index)
PyObject* g_unsupported_dtype = nullptr;  // dtypes.raise_unsupported_dtype(dtype, device index)

Holder* checked_holder(const at::Tensor& t) {
  TORCH_CHECK(t.device().type() == kPjrt, "pjrt: expected a pjrt tensor, got one on ", t.device());
  Holder* h = holder_of(t.storage());
  TORCH_CHECK(h, "pjrt: tensor storage was not allocated by the pjrt allocator");
  return h;
}

PyObject* g_torch_dtypes = nullptr;  // set_dtype_map's dict
// An executable's outputs share their aval objects, so the eager hot path reads no
// Python attributes for a shape and dtype it has seen.
std::array<ArrayType, 256> g_array_types;

}  // namespace

PyObject* g_pending_type = nullptr;
PendingSlots g_pending;

Slot Slot::of(PyObject* type, const char* name) {
  py::object descr = py::reinterpret_steal<py::object>(PyObject_GetAttrString(type, name));
  if (!descr) throw python_error();
  TORCH_CHECK(Py_TYPE(descr.ptr()) == &PyMemberDescr_Type, "pjrt: ", reinterpret_cast<PyTypeObject*>(type)->tp_name,
              ".", name, " is not a __slots__ member");
  PyMemberDef* member = reinterpret_cast<PyMemberDescrObject*>(descr.ptr())->d_member;
  TORCH_CHECK(member->type == T_OBJECT_EX, "pjrt: ", name, " is not an object slot");
  return Slot{member->offset, name};
}

PyObject* Slot::get(PyObject* o) const {
  PyObject* v = *reinterpret_cast<PyObject**>(reinterpret_cast<char*>(o) + offset);
  if (!v) {
    PyErr_Format(PyExc_AttributeError, "pjrt: %s.%s is unset", Py_TYPE(o)->tp_name, name);
    throw python_error();
  }
  return v;
}

void Slot::set(PyObject* o, PyObject* value) const {
  PyObject** place = reinterpret_cast<PyObject**>(reinterpret_cast<char*>(o) + offset);
  Py_XINCREF(value);
  PyObject* old = *place;
  *place = value;
  Py_XDECREF(old);
}

void settle(Holder* h) {
  if (!h || !h->buffer || !is_pending(h->buffer)) return;
  PyObject* value = g_pending.value.get(h->buffer);
  if (value == Py_None) return;
  Py_INCREF(value);
  std::swap(h->buffer, value);  // the holder takes the array; `value` now holds the Pending
  Py_DECREF(value);
}

bool is_whole_storage(const at::Tensor& t, const Holder* h) {
  return h && h->buffer && t.storage_offset() == 0 && t.scalar_type() == h->dtype && t.is_contiguous() &&
         !t.is_conj() && !t.is_neg() && t.storage().nbytes() == size_t(t.numel()) * t.element_size();
}

bool is_whole_buffer(const at::Tensor& t, const Holder* h) {
  return h && h->buffer && t.storage_offset() == 0 && t.scalar_type() == h->dtype &&
         t.sizes() == c10::IntArrayRef(h->shape) && t.is_contiguous() && !t.is_conj() && !t.is_neg();
}

py::object whole_buffer(const at::Tensor& t) {
  Holder* h = holder_of(t.storage());
  settle(h);
  if (!is_whole_buffer(t, h)) return py::none();
  return py::reinterpret_borrow<py::object>(h->buffer);
}

py::object buffer(const at::Tensor& t) {
  Holder* h = checked_holder(t);
  settle(h);
  if (!h->buffer) return py::none();
  return py::reinterpret_borrow<py::object>(h->buffer);
}

void set_buffer(const at::Tensor& t, py::object obj, std::vector<int64_t> shape, c10::ScalarType dtype) {
  Holder* h = checked_holder(t);
  if (h->buffer) note_replaced(obj.ptr(), h->buffer);
  PyObject* o = obj.release().ptr();
  std::swap(h->buffer, o);
  h->shape = std::move(shape);
  h->dtype = dtype;
  h->appended = false;
  Py_XDECREF(o);
}

bool appended(const at::Tensor& t) {
  Holder* h = checked_holder(t);
  settle(h);
  return h->appended && is_whole_buffer(t, h);
}

void set_appended(const at::Tensor& t) { checked_holder(t)->appended = true; }

at::Tensor wrap(py::object obj, std::vector<int64_t> shape, c10::ScalarType dtype, c10::DeviceIndex device) {
  int64_t numel = 1;
  for (auto s : shape) numel *= s;
  size_t nbytes = size_t(numel) * c10::elementSize(dtype);
  auto dp = allocate_on(device, nbytes);
  auto* h = static_cast<Holder*>(dp.get_context());
  h->buffer = obj.release().ptr();
  h->shape = shape;
  h->dtype = dtype;
  c10::Storage storage(c10::Storage::use_byte_size_t(), nbytes, std::move(dp), device_allocator(), /*resizable=*/true);
  auto t = at::detail::make_tensor<c10::TensorImpl>(std::move(storage), pjrt_keys(), c10::scalarTypeToTypeMeta(dtype));
  t.unsafeGetTensorImpl()->set_sizes_contiguous(shape);
  return t;
}

void set_dtype_map(py::dict jax_to_torch) {
  std::vector<c10::ScalarType> supported;
  for (auto item : jax_to_torch) supported.push_back(item.second.cast<c10::ScalarType>());
  set_supported_dtypes(supported);
  Py_XDECREF(g_torch_dtypes);
  g_torch_dtypes = jax_to_torch.release().ptr();
}

const ArrayType& array_type(const py::object& array) {
  static PyObject* aval_name = PyUnicode_InternFromString("aval");
  py::object aval = py::reinterpret_steal<py::object>(PyObject_GetAttr(array.ptr(), aval_name));
  if (!aval) throw python_error();
  auto& entry = g_array_types[(reinterpret_cast<uintptr_t>(aval.ptr()) >> 4) % g_array_types.size()];
  if (entry.aval != aval.ptr()) {
    entry.shape = aval.attr("shape").cast<std::vector<int64_t>>();
    entry.dtype = py::reinterpret_borrow<py::dict>(g_torch_dtypes)[aval.attr("dtype")].cast<c10::ScalarType>();
    Py_XDECREF(entry.aval);
    entry.aval = aval.release().ptr();
  }
  return entry;
}

at::Tensor wrap_array(py::object array, c10::DeviceIndex device) {
  const ArrayType& type = array_type(array);
  return wrap(std::move(array), type.shape, type.dtype, device);
}

int64_t storage_nbytes(const at::Tensor& t) { return int64_t(t.storage().nbytes()); }

bool deterministic_fill(const at::Tensor& t) { return checked_holder(t)->deterministic_fill; }

void synchronize_device(c10::DeviceIndex idx) {
  if (!g_synchronize || !Py_IsInitialized()) return;
  py::gil_scoped_acquire gil;
  py::handle callback(g_synchronize);
  callback(int(idx));
}

void raise_unsupported_dtype(c10::ScalarType dtype, c10::DeviceIndex device) {
  if (!g_unsupported_dtype) return;
  py::gil_scoped_acquire gil;
  py::reinterpret_borrow<py::object>(g_unsupported_dtype)(dtype, device);  // raises
}

namespace {

// 64 random bits from a pjrt generator (the default one of `device` when None).
uint64_t py_next_seed(py::object generator, c10::DeviceIndex device) {
  return next_seed(generator.is_none() ? default_generator(device) : THPGenerator_Unwrap(generator.ptr()));
}

py::object py_default_generator(int idx) {
  return py::reinterpret_steal<py::object>(THPGenerator_initDefaultGenerator(default_generator(idx)));
}

void init(int device_count, std::vector<int64_t> limits, py::object synchronize) {
  TORCH_CHECK(device_count > 0 && device_count <= kMaxDevices, "pjrt: unsupported device count ", device_count);
  g_device_count = device_count;
  for (int i = 0; i < device_count && i < int(limits.size()); i++) g_memory[i].limit = limits[i];
  Py_XDECREF(g_synchronize);
  g_synchronize = synchronize.release().ptr();
  register_hooks();
  register_profiler_stubs();
}

py::dict memory_stats(int device) {
  auto& m = g_memory[checked_index(device)];
  py::dict d;
  d["allocated_bytes.all.current"] = m.allocated.load();
  d["allocated_bytes.all.peak"] = m.peak.load();
  d["allocation.all.allocated"] = m.allocations.load();
  d["allocation.all.freed"] = m.frees.load();
  d["allocation.all.current"] = m.allocations.load() - m.frees.load();
  d["num_ooms"] = m.oom.load();
  d["capacity_bytes"] = m.limit;
  return d;
}

void set_unsupported_dtype_handler(py::function raise_error) {
  Py_XDECREF(g_unsupported_dtype);
  g_unsupported_dtype = raise_error.release().ptr();
}

void reset_peak(int device) {
  auto& m = g_memory[checked_index(device)];
  m.peak = m.allocated.load();
}

}  // namespace
}  // namespace torch_pjrt

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  namespace tp = torch_pjrt;
  m.def("init", &tp::init);
  m.def("whole_buffer", &tp::whole_buffer);
  m.def("buffer", &tp::buffer);
  m.def("set_buffer", &tp::set_buffer);
  // a tensor that is exactly its storage's buffer, an append's exact result (eager/kernels.py's growth)
  m.def("appended", &tp::appended);
  m.def("set_appended", &tp::set_appended);
  m.def("wrap", &tp::wrap);
  m.def("wrap_array", &tp::wrap_array);
  m.def("set_dtype_map", &tp::set_dtype_map);
  m.def("set_unsupported_dtype_handler", &tp::set_unsupported_dtype_handler);
  m.def("storage_nbytes", &tp::storage_nbytes);
  // whether the storage's fresh memory reads as deterministic mode's fill (decided when it was made)
  m.def("deterministic_fill", &tp::deterministic_fill);
  m.def("set_eager_helpers", &tp::set_eager_helpers);
  m.def("register_fast_kernel", &tp::register_fast_kernel);
  m.def("register_clone_kernel", &tp::register_clone_kernel);
  m.def("register_to_copy_kernel", &tp::register_to_copy_kernel);
  m.def("set_transfer_helpers", &tp::set_transfer_helpers);
  m.def("register_scalar_read_kernel", &tp::register_scalar_read_kernel);
  m.def("set_safe_point", &tp::set_safe_point);
  m.def("forget_recorded_signatures", &tp::forget_recorded_signatures);
  m.def("regions_moved", &tp::regions_moved);
  m.def("set_growth_helpers", &tp::set_growth_helpers);
  m.def("padded_view", [](py::object padded, py::tuple geometry) { return tp::padded_view(padded.ptr(), geometry.ptr()); });
  m.def("set_fused", &tp::set_fused);
  m.def("set_index_check_helpers", &tp::set_index_check_helpers);
  m.def("store_whole", &tp::store_whole);
  m.def("set_ring_attention_active", &tp::set_ring_attention_active);
  m.def("fast_path_counts", &tp::fast_path_counts);
  m.def("set_recorder_helpers", &tp::set_recorder_helpers);
  m.def("region_plan", &tp::region_plan);
  m.def("run_cached_region", [](py::object region, py::object reason) { return tp::run_cached_region(region.ptr(), reason.ptr()); });
  m.def("digest_call", [](py::object digest, int64_t call_id, py::tuple refs) { tp::digest_call(digest.ptr(), call_id, refs.ptr()); });
  m.def("reset_fast_path_counts", &tp::reset_fast_path_counts);
  // a Python number the arg parser wrapped into a CPU tensor: promotes as a Scalar
  m.def("is_wrapped_number", [](const at::Tensor& t) { return t.unsafeGetTensorImpl()->is_wrapped_number(); });
  m.def("next_seed", &tp::py_next_seed);
  m.def("default_generator", &tp::py_default_generator);
  m.def("memory_stats", &tp::memory_stats);
  m.def("reset_peak", &tp::reset_peak);
  m.def("current_device", []() { return int(tp::g_current_device); });
  m.def("set_device", [](int d) { tp::g_current_device = tp::checked_index(d); });
  m.def("device_count", []() { return tp::g_device_count; });
  // a device index checked as the device guard checks it (IndexError naming the count)
  m.def("checked_device", [](int d) { return int(tp::checked_index(d)); });
  m.attr("torch_version") = TORCH_VERSION;
}
