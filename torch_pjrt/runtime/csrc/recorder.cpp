// The fused-eager recorder's steady path, in C++: a fast kernel's call recorded into its
// thread's region (runtime/fused.py) without running Python code.
//
// fused.record does the same in Python for every call; here a call whose signature this
// kernel has recorded before (the same static arguments, the same operand avals) appends to
// the region's lists directly: its operands' references, its output Pendings, its entry in
// the region's structure. The first sight of a signature asks fused.call_signature (which
// traces the call, as record does) and keeps the answer. Anything unusual (another thread's
// pending operand, a region of another device, a leaf that is not an array or a Pending) is
// left to fused.record, which owns the full semantics. The region, its key and its run stay
// in Python: a region has the same structure however its calls were recorded, so it finds
// the same executable.
#include "bindings.h"

#include <ATen/core/ivalue.h>
#include <torch/csrc/Exceptions.h>

#include <algorithm>
#include <cstring>
#include <map>

namespace torch_pjrt {

namespace {

struct RecorderHelpers {
  PyObject* current_region = nullptr;  // fused.current_region()
  PyObject* call_signature = nullptr;  // fused.call_signature(rec, args)
  PyObject* end_region = nullptr;      // fused.end_region(region, reason)
  PyObject* lock = nullptr;            // fused._lock (an RLock)
  PyObject* open_regions = nullptr;    // fused._open
  PyObject* pending_type = nullptr;    // fused.Pending
  PyObject* array_type = nullptr;      // jax's concrete array class
  PyObject* strided_view_type = nullptr;  // storage.StridedView
  PyObject* fused = nullptr;           // the fused module (its MAX_CALLS, read per call: a test may set it)
  bool single_device = true;           // fused._devices_are_one(): regions keep no device
  // interned attribute names
  PyObject *calls, *structure, *inputs, *input_index, *outputs, *device, *ran, *aval, *value, *region, *slot, *shape,
      *static_, *max_ops, *geometry, *buffer, *max_calls, *another_thread, *host_read, *dtype;
};
RecorderHelpers g_rec;
bool g_ready = false;

thread_local PyObject* t_region = nullptr;  // this thread's region, as fused.current_region() last gave it
// which region a thread records into changed (fused lends a region to autograd's threads): every
// thread asks fused.current_region() again. Read and written with the GIL held.
uint64_t g_region_epoch = 0;
thread_local uint64_t t_region_epoch = 0;

bool is_value(PyObject* leaf) {  // an array or a Pending: a leaf of its own
  PyTypeObject* type = Py_TYPE(leaf);
  return type == reinterpret_cast<PyTypeObject*>(g_rec.array_type) ||
         type == reinterpret_cast<PyTypeObject*>(g_rec.pending_type);
}

void set_attr(PyObject* o, PyObject* name, PyObject* value) {
  if (PyObject_SetAttr(o, name, value) < 0) throw python_error();
}

struct RegionSlots {  // fused.Region's
  Slot calls, structure, inputs, input_index, outputs, device, ran, digest;
};
RegionSlots g_region;
PyObject* g_region_type = nullptr;

// The region this thread records into (a new one once the last ran).
PyObject* current_region() {
  if (t_region && t_region_epoch == g_region_epoch && g_region.ran.get(t_region) != Py_True) return t_region;
  Py_CLEAR(t_region);
  t_region_epoch = g_region_epoch;
  t_region = PyObject_CallNoArgs(g_rec.current_region);
  if (!t_region) throw python_error();
  PyObject* type = reinterpret_cast<PyObject*>(Py_TYPE(t_region));
  if (type != g_region_type) {  // the first region: where its slots lie
    g_region = {Slot::of(type, "calls"), Slot::of(type, "structure"), Slot::of(type, "inputs"),
                Slot::of(type, "input_index"), Slot::of(type, "outputs"), Slot::of(type, "device"),
                Slot::of(type, "ran"), Slot::of(type, "digest")};
    g_region_type = type;
  }
  return t_region;
}

// A Pending(aval, region, slot) made without running its Python __init__: no bytecode runs
// while a call is recorded.
py::object new_pending(PyObject* aval, PyObject* region, Py_ssize_t slot) {
  auto* type = reinterpret_cast<PyTypeObject*>(g_rec.pending_type);
  PyObject* o = type->tp_alloc(type, 0);
  if (!o) throw python_error();
  py::object pending = py::reinterpret_steal<py::object>(o);
  py::object index = py::reinterpret_steal<py::object>(PyLong_FromSsize_t(slot));
  g_pending.aval.set(o, aval);
  g_pending.value.set(o, Py_None);
  g_pending.region.set(o, region);
  g_pending.slot.set(o, index.ptr());
  g_pending.replaces.set(o, Py_None);
  return pending;
}

py::object borrowed(PyObject* o) { return py::reinterpret_borrow<py::object>(o); }

// A static argument as key words; false for one this cache does not key (fused.record then).
bool static_key(const c10::IValue& v, std::vector<int64_t>& key) {
  auto push_double = [&](double d) {
    int64_t bits;
    std::memcpy(&bits, &d, sizeof(d));
    key.push_back(bits);
  };
  if (v.isNone()) {
    key.push_back(1);
  } else if (v.isBool()) {  // a bool is not an int here: True and 1 trace differently
    key.insert(key.end(), {2, v.toBool()});
  } else if (v.isInt()) {
    key.insert(key.end(), {3, v.toInt()});
  } else if (v.isDouble()) {
    key.push_back(4);
    push_double(v.toDouble());
  } else if (v.isString()) {
    const std::string& s = v.toStringRef();
    key.insert(key.end(), {5, int64_t(s.size())});
    for (size_t i = 0; i < s.size(); i += 8) {
      int64_t chunk = 0;
      std::memcpy(&chunk, s.data() + i, std::min<size_t>(8, s.size() - i));
      key.push_back(chunk);
    }
  } else if (v.isIntList()) {
    auto list = v.toIntList();
    key.insert(key.end(), {6, int64_t(list.size())});
    for (int64_t x : list) key.push_back(x);
  } else if (v.isDoubleList()) {
    auto list = v.toDoubleList();
    key.insert(key.end(), {7, int64_t(list.size())});
    for (double x : list) push_double(x);
  } else if (v.isBoolList()) {
    auto list = v.toBoolList();
    key.insert(key.end(), {8, int64_t(list.size())});
    for (bool x : list) key.push_back(x);
  } else if (v.isDevice()) {
    key.insert(key.end(), {9, int64_t(v.toDevice().type()), v.toDevice().index()});
  } else {
    return false;
  }
  return true;
}

}  // namespace

namespace {
// A lock's bound acquire and release methods, looked up once per lock (the runtime holds two).
struct BoundLock {
  PyObject* lock = nullptr;
  PyObject* acquire = nullptr;
  PyObject* release = nullptr;
};
BoundLock g_bound_locks[4];

const BoundLock& bound(PyObject* lock) {
  for (auto& b : g_bound_locks) {
    if (b.lock == lock) return b;
    if (!b.lock) {
      PyObject* acquire = PyObject_GetAttrString(lock, "acquire");
      PyObject* release = acquire ? PyObject_GetAttrString(lock, "release") : nullptr;
      if (!release) {
        Py_XDECREF(acquire);
        throw python_error();
      }
      Py_INCREF(lock);
      b = {lock, acquire, release};
      return b;
    }
  }
  TORCH_CHECK(false, "pjrt: more Python locks than the recorder keeps");
}
}  // namespace

py::object attr(PyObject* o, PyObject* name) {
  PyObject* v = PyObject_GetAttr(o, name);
  if (!v) throw python_error();
  return py::reinterpret_steal<py::object>(v);
}

PyLockGuard::PyLockGuard(PyObject* lock) : lock_(lock) {
  PyObject* r = PyObject_CallNoArgs(bound(lock_).acquire);
  if (!r) throw python_error();
  Py_DECREF(r);
}

PyLockGuard::~PyLockGuard() {
  PyObject *type, *value, *trace;
  PyErr_Fetch(&type, &value, &trace);  // release with a pending error kept
  PyObject* r = PyObject_CallNoArgs(bound(lock_).release);
  Py_XDECREF(r);
  PyErr_Restore(type, value, trace);
}

py::object new_slotted(PyObject* type, std::initializer_list<std::pair<PyObject*, PyObject*>> slots) {
  auto* t = reinterpret_cast<PyTypeObject*>(type);
  PyObject* o = t->tp_alloc(t, 0);
  if (!o) throw python_error();
  py::object instance = py::reinterpret_steal<py::object>(o);
  for (auto [name, value] : slots) set_attr(o, name, value);
  return instance;
}

void note_replaced(PyObject* now, PyObject* before) {
  if (!is_pending(now) || now == before) return;
  if (is_pending(before)) {  // a chain of updates in one region (weight decay, then the step): its first input
    g_pending.replaces.set(now, g_pending.replaces.get(before));
    return;
  }
  if (Py_TYPE(before) != reinterpret_cast<PyTypeObject*>(g_rec.array_type)) return;
  py::object id = py::reinterpret_steal<py::object>(PyLong_FromVoidPtr(before));
  g_pending.replaces.set(now, id.ptr());
}

py::tuple region_plan(py::list outputs, py::list inputs, py::dict input_index) {
  using Type = std::pair<std::vector<int64_t>, int>;
  auto donatable = [&](Py_ssize_t k) -> const ArrayType* {
    // an array only the region holds (one in synchronize's bookkeeping has more holders: it is
    // not donated, which is always safe); a scalar is not worth it, and whether one is donated
    // would vary the key by chance
    PyObject* input = PyList_GET_ITEM(inputs.ptr(), k);
    if (Py_TYPE(input) != reinterpret_cast<PyTypeObject*>(g_rec.array_type) || Py_REFCNT(input) > 1) return nullptr;
    const ArrayType& type = array_type(py::reinterpret_borrow<py::object>(input));
    return type.shape.empty() ? nullptr : &type;
  };
  std::vector<Py_ssize_t> live;
  std::vector<Type> live_type;
  for (Py_ssize_t i = 0; i < PyList_GET_SIZE(outputs.ptr()); i++) {
    PyObject* pending = PyList_GET_ITEM(outputs.ptr(), i);
    if (Py_REFCNT(pending) <= 1) continue;  // the region's list alone holds it: never materialized
    const ArrayType& type = array_type(py::reinterpret_borrow<py::object>(pending));
    live.push_back(i);
    live_type.push_back({type.shape, int(type.dtype)});
  }
  const Py_ssize_t n_inputs = PyList_GET_SIZE(inputs.ptr());
  std::vector<Py_ssize_t> paired_input(live.size(), -1);  // per live output: the input it writes in place
  std::vector<bool> taken(size_t(n_inputs), false);
  // an output that replaced an input as a storage's buffer takes that input (an in-place update)
  for (size_t j = 0; j < live.size(); j++) {
    PyObject* replaces = g_pending.replaces.get(PyList_GET_ITEM(outputs.ptr(), live[j]));
    if (replaces == Py_None) continue;
    PyObject* position = PyDict_GetItemWithError(input_index.ptr(), replaces);
    if (!position) {
      if (PyErr_Occurred()) throw python_error();
      continue;
    }
    Py_ssize_t k = PyLong_AsSsize_t(position);
    const ArrayType* type = k >= 0 && k < n_inputs && !taken[k] ? donatable(k) : nullptr;
    if (!type || Type{type->shape, int(type->dtype)} != live_type[j]) continue;
    paired_input[j] = k;
    taken[k] = true;
  }
  // the other donatable inputs: any live output of the same shape and dtype left (its buffer reused)
  std::map<Type, std::vector<size_t>> room;  // unpaired live outputs by type, in order
  for (size_t j = live.size(); j-- > 0;)
    if (paired_input[j] < 0) room[live_type[j]].push_back(j);
  for (Py_ssize_t k = 0; k < n_inputs; k++) {
    if (taken[k]) continue;
    const ArrayType* type = donatable(k);
    if (!type) continue;
    auto found = room.find({type->shape, int(type->dtype)});
    if (found == room.end() || found->second.empty()) continue;
    paired_input[found->second.back()] = k;
    found->second.pop_back();
    taken[k] = true;
  }
  // paired outputs first, in their inputs' order, then the rest in region order: JAX gives each
  // output the first donated input of its type left, so its pairs are these
  std::vector<size_t> order(live.size());
  for (size_t j = 0; j < order.size(); j++) order[j] = j;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    Py_ssize_t ka = paired_input[a], kb = paired_input[b];
    if ((ka < 0) != (kb < 0)) return ka >= 0;
    return ka >= 0 && ka < kb;
  });
  py::tuple live_out(order.size());
  std::vector<Py_ssize_t> donate;
  for (size_t j = 0; j < order.size(); j++) {
    live_out[j] = py::int_(live[order[j]]);
    if (paired_input[order[j]] >= 0) donate.push_back(paired_input[order[j]]);
  }
  std::sort(donate.begin(), donate.end());
  py::tuple donate_out(donate.size());
  for (size_t j = 0; j < donate.size(); j++) donate_out[j] = py::int_(donate[j]);
  return py::make_tuple(live_out, donate_out);
}

py::object strided_view(PyObject* buffer, PyObject* geometry) {
  if (!g_ready || !is_value(buffer)) return py::object();  // a Padded buffer: padded_view
  return new_slotted(g_rec.strided_view_type, {{g_rec.buffer, buffer}, {g_rec.geometry, geometry}});
}

namespace {
std::vector<int64_t> row_major(const std::vector<int64_t>& shape) {
  std::vector<int64_t> strides(shape.size());
  int64_t step = 1;
  for (size_t k = shape.size(); k-- > 0;) {
    strides[k] = step;
    step *= shape[k];
  }
  return strides;
}

std::vector<int64_t> ints(PyObject* sequence) {  // a geometry's sizes or strides: a tuple, from both callers
  if (!PyTuple_Check(sequence)) return py::cast<std::vector<int64_t>>(py::handle(sequence));
  std::vector<int64_t> out(size_t(PyTuple_GET_SIZE(sequence)));
  for (size_t i = 0; i < out.size(); i++) out[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(sequence, Py_ssize_t(i)));
  return out;
}

// A view's (sizes, strides, offset) over the exact row-major value of a padded storage, carried
// over to its padded array (`physical`: the value's shape but longer along the growing axis):
// the strides and offset there. False when a view dim does not step along one coordinate of the
// value without carrying into the next (a reshape across the growing axis).
bool carried_over(const std::vector<int64_t>& exact, const std::vector<int64_t>& physical,
                  const std::vector<int64_t>& size, const std::vector<int64_t>& stride, int64_t offset,
                  std::vector<int64_t>& new_stride, int64_t& new_offset) {
  const std::vector<int64_t> exact_strides = row_major(exact), physical_strides = row_major(physical);
  std::vector<int64_t> coords(exact.size(), 0);
  for (size_t k = 0; k < exact.size(); k++) {
    if (exact_strides[k] == 0) continue;
    coords[k] = offset / exact_strides[k];
    offset %= exact_strides[k];
  }
  std::vector<int64_t> reach = coords;  // the largest coordinate the view reaches, per dim of the value
  new_stride.clear();
  for (size_t i = 0; i < size.size(); i++) {
    if (size[i] == 1 || stride[i] == 0) {
      new_stride.push_back(0);
      continue;
    }
    size_t k = 0;
    while (k < exact.size() && !(exact[k] > 1 && exact_strides[k] > 0 && stride[i] % exact_strides[k] == 0)) k++;
    if (k == exact.size()) return false;
    const int64_t step = stride[i] / exact_strides[k];
    reach[k] += step * (size[i] - 1);
    new_stride.push_back(step * physical_strides[k]);
  }
  for (size_t k = 0; k < exact.size(); k++)
    if (exact[k] && reach[k] >= exact[k]) return false;
  new_offset = 0;
  for (size_t k = 0; k < exact.size(); k++) new_offset += coords[k] * physical_strides[k];
  return true;
}
}  // namespace

py::object padded_view(PyObject* padded, PyObject* geometry) {
  // geometry: (sizes, strides, offset, JAX dtype, conj, neg), as storage.read_lazily makes it
  py::object array = attr(padded, g_growth.array);
  const ArrayType& type = array_type(array);
  std::vector<int64_t> exact = type.shape;
  exact.at(attr(padded, g_growth.axis).cast<size_t>()) = attr(padded, g_growth.length).cast<int64_t>();
  py::object dtype = attr(type.aval, g_rec.dtype);
  const int same_dtype = PyObject_RichCompareBool(PyTuple_GET_ITEM(geometry, 3), dtype.ptr(), Py_EQ);
  if (same_dtype < 0) throw python_error();
  std::vector<int64_t> stride;
  int64_t offset = 0;
  if (same_dtype &&
      carried_over(exact, type.shape, ints(PyTuple_GET_ITEM(geometry, 0)), ints(PyTuple_GET_ITEM(geometry, 1)),
                   PyLong_AsLongLong(PyTuple_GET_ITEM(geometry, 2)), stride, offset)) {
    // a view of a growing tensor (its last token) costs one executable per capacity, not per length
    py::tuple carried(PyTuple_GET_SIZE(geometry));
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(geometry); i++)
      carried[i] = py::reinterpret_borrow<py::object>(PyTuple_GET_ITEM(geometry, i));
    py::tuple strides(stride.size());
    for (size_t i = 0; i < stride.size(); i++) strides[i] = py::int_(stride[i]);
    carried[1] = strides;
    carried[2] = py::int_(offset);
    return new_slotted(g_rec.strided_view_type, {{g_rec.buffer, array.ptr()}, {g_rec.geometry, carried.ptr()}});
  }
  return new_slotted(g_rec.strided_view_type, {{g_rec.buffer, padded}, {g_rec.geometry, geometry}});
}

// A region's digest: 16 bytes (a bytearray, Region.digest) folded over each recorded call's
// (call id, refs) as it is recorded, by both recorders. With the region's device, live outputs and
// donations it keys the region's executable (fused._executables): a sync point finds it without
// walking the region's structure. Two 64-bit lanes with independent mixing: a collision of two
// structures would take ~2^64 regions.
namespace {
inline uint64_t mix64(uint64_t z) {  // splitmix64's finalizer
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}
inline void fold(uint64_t* lanes, uint64_t word) {
  lanes[0] = mix64(lanes[0] ^ word) + 0x9e3779b97f4a7c15ULL;
  lanes[1] = (lanes[1] ^ mix64(word + 0x632be59bd9b4e019ULL)) * 0xff51afd7ed558ccdULL + (lanes[1] >> 33);
}
}  // namespace

void digest_call(PyObject* digest, int64_t call_id, PyObject* refs) {
  if (!PyByteArray_CheckExact(digest) || PyByteArray_GET_SIZE(digest) != 16)
    throw std::runtime_error("pjrt: a fused region's digest is not 16 bytes");
  uint64_t lanes[2];
  std::memcpy(lanes, PyByteArray_AS_STRING(digest), 16);
  const Py_ssize_t n = PyTuple_GET_SIZE(refs);
  fold(lanes, uint64_t(call_id));
  fold(lanes, uint64_t(n));
  for (Py_ssize_t i = 0; i < n; i++) fold(lanes, uint64_t(PyLong_AsLongLong(PyTuple_GET_ITEM(refs, i))));
  if (PyErr_Occurred()) throw python_error();
  std::memcpy(PyByteArray_AS_STRING(digest), lanes, 16);
}

namespace {
struct RunHelpers {  // fused's bookkeeping of runs, looked up once
  PyObject *executables, *one_op_runs, *stats, *ended_by, *recent, *open, *failed_run, *recent_outputs;
  PyObject *move_to_end, *append, *discard;
  PyObject *regions, *ops, *cache_hits, *k_ops, *k_ended_by, *k_executable, *k_outputs, *k_materialized, *cached,
      *one_op;
};
RunHelpers* g_run = nullptr;

void count(PyObject* counter, PyObject* key, Py_ssize_t n) {
  PyObject* now = PyDict_GetItemWithError(counter, key);
  if (!now && PyErr_Occurred()) throw python_error();
  py::object value = py::reinterpret_steal<py::object>(PyLong_FromSsize_t((now ? PyLong_AsSsize_t(now) : 0) + n));
  if (PyDict_SetItem(counter, key, value.ptr()) < 0) throw python_error();
}

void call_method(PyObject* o, PyObject* name, PyObject* arg) {
  PyObject* r = PyObject_CallMethodOneArg(o, name, arg);
  if (!r) throw python_error();
  Py_DECREF(r);
}
}  // namespace

void end_region(PyObject* region, PyObject* reason) {
  {
    PyLockGuard lock(g_rec.lock);
    safe_point();
    if (run_cached_region(region, reason)) return;
  }
  PyObject* r = PyObject_CallFunctionObjArgs(g_rec.end_region, region, reason, nullptr);
  if (!r) throw python_error();
  Py_DECREF(r);
}

void flush_region(PyObject* reason) {
  if (!g_ready) return;
  py::object region = borrowed(current_region());
  if (PyList_GET_SIZE(g_region.calls.get(region.ptr())) == 0) return;
  end_region(region.ptr(), reason ? reason : g_rec.host_read);
}

bool run_cached_region(PyObject* region, PyObject* reason) {
  if (!g_ready || !g_region_type || Py_TYPE(region) != reinterpret_cast<PyTypeObject*>(g_region_type)) return false;
  PyObject* device = g_region.device.get(region);
  if (g_region.ran.get(region) == Py_True || (device != Py_None && PyLong_AsLong(device) != 0)) return false;
  if (!g_run) {
    auto name = [](const char* s) { return PyUnicode_InternFromString(s); };
    auto of_fused = [](const char* s) { return attr(g_rec.fused, py::str(s).ptr()).release().ptr(); };
    g_run = new RunHelpers{of_fused("_executables"), of_fused("_one_op_runs"), of_fused("_stats"), of_fused("_ended_by"),
                           of_fused("_recent_regions"), g_rec.open_regions, of_fused("_after_failed_run"),
                           of_fused("_recent_outputs"),
                           name("move_to_end"), name("append"), name("discard"),
                           name("regions"), name("ops"), name("cache_hits"), name("ops"), name("ended_by"),
                           name("executable"), name("outputs"), name("materialized"), name("cached"),
                           name("one op")};
  }
  PyObject* outputs = g_region.outputs.get(region);
  PyObject* inputs = g_region.inputs.get(region);
  py::tuple plan = region_plan(py::reinterpret_borrow<py::list>(outputs), py::reinterpret_borrow<py::list>(inputs),
                               py::reinterpret_borrow<py::dict>(g_region.input_index.get(region)));
  PyObject* live = PyTuple_GET_ITEM(plan.ptr(), 0);
  PyObject* donate = PyTuple_GET_ITEM(plan.ptr(), 1);
  PyObject* digest = g_region.digest.get(region);
  py::object key = py::make_tuple(py::handle(device),
                                  py::reinterpret_steal<py::object>(PyBytes_FromObject(digest)),
                                  py::handle(live), py::handle(donate));
  // a compiled region's executable, else a one-op region's call (fused._one_op_run: no executable of its own)
  PyObject* table = g_run->executables;
  PyObject* run = PyDict_GetItemWithError(table, key.ptr());  // borrowed
  if (!run && !PyErr_Occurred()) {
    table = g_run->one_op_runs;
    run = PyDict_GetItemWithError(table, key.ptr());
  }
  if (!run) {
    if (PyErr_Occurred()) throw python_error();
    return false;  // first sight, a compile, a region run call by call: fused._run
  }
  const bool one_op = table == g_run->one_op_runs;
  py::object executable = py::reinterpret_borrow<py::object>(run);
  g_region.ran.set(region, Py_True);
  call_method(g_run->open, g_run->discard, region);
  const Py_ssize_t n_calls = PyList_GET_SIZE(g_region.calls.get(region));
  count(g_run->ended_by, reason, 1);
  count(g_run->stats, g_run->regions, 1);
  count(g_run->stats, g_run->ops, n_calls);
  if (!one_op) count(g_run->stats, g_run->cache_hits, 1);
  call_method(table, g_run->move_to_end, key.ptr());
  py::dict note;
  note[py::handle(g_run->k_ops)] = py::int_(n_calls);
  note[py::handle(g_run->k_ended_by)] = py::handle(reason);
  note[py::handle(g_run->k_executable)] = py::handle(one_op ? g_run->one_op : g_run->cached);
  note[py::handle(g_run->k_outputs)] = py::int_(PyList_GET_SIZE(outputs));
  note[py::handle(g_run->k_materialized)] = py::int_(PyTuple_GET_SIZE(live));
  call_method(g_run->recent, g_run->append, note.ptr());
  // the region's outputs and inputs go once it ran, whatever happens (Pending.region <-> region.outputs is a
  // cycle), unless an interruption gave the region back to its thread (_after_failed_run: ran is False again)
  struct Release {
    PyObject *region, *outputs, *inputs, *index;
    ~Release() {
      if (g_region.ran.get(region) != Py_True) return;
      PyObject *type, *value, *trace;
      PyErr_Fetch(&type, &value, &trace);
      for (Py_ssize_t i = 0; i < PyList_GET_SIZE(outputs); i++) g_pending.region.set(PyList_GET_ITEM(outputs, i), Py_None);
      PyList_SetSlice(outputs, 0, PyList_GET_SIZE(outputs), nullptr);
      PyList_SetSlice(inputs, 0, PyList_GET_SIZE(inputs), nullptr);
      PyDict_Clear(index);
      PyErr_Restore(type, value, trace);
    }
  } release{region, outputs, inputs, g_region.input_index.get(region)};
  PyObject* results = PyObject_Vectorcall(executable.ptr(), PySequence_Fast_ITEMS(inputs), PyList_GET_SIZE(inputs),
                                          nullptr);
  if (!results) {  // fused._after_failed_run: raise it (donated inputs are gone; an interruption) or run the calls one by one
    PyObject *type, *value, *trace;
    PyErr_Fetch(&type, &value, &trace);
    PyErr_NormalizeException(&type, &value, &trace);
    if (trace) PyException_SetTraceback(value, trace);
    py::object error = py::reinterpret_steal<py::object>(value);
    Py_XDECREF(type);
    Py_XDECREF(trace);
    PyObject* r = PyObject_CallFunctionObjArgs(g_run->failed_run, region, live, donate, error.ptr(), nullptr);
    if (!r) throw python_error();
    Py_DECREF(r);
    return true;
  }
  py::object values = py::reinterpret_steal<py::object>(results);
  py::object items = py::reinterpret_steal<py::object>(PySequence_Fast(values.ptr(), "a region's results"));
  if (!items) throw python_error();
  for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(live); j++) {
    PyObject* value = PySequence_Fast_GET_ITEM(items.ptr(), j);
    g_pending.value.set(PyList_GET_ITEM(outputs, PyLong_AsSsize_t(PyTuple_GET_ITEM(live, j))), value);
    // synchronize() waits for the latest outputs (fused._recent_outputs: weakly held, so still donatable)
    py::object ref = py::reinterpret_steal<py::object>(PyWeakref_NewRef(value, nullptr));
    if (!ref) throw python_error();
    call_method(g_run->recent_outputs, g_run->append, ref.ptr());
  }
  return true;
}

py::object pending_value(PyObject* pending, PyObject* reason) {
  PyObject* value = g_pending.value.get(pending);
  if (value != Py_None) return borrowed(value);
  // held while its region runs: a caller's pointer may be borrowed from a storage's buffer, which
  // another thread may replace (and release) while this one waits for the lock or XLA without the GIL
  py::object held = borrowed(pending);
  py::object region = borrowed(g_pending.region.get(pending));
  if (!region.is_none()) end_region(region.ptr(), reason ? reason : g_rec.host_read);
  value = g_pending.value.get(pending);
  return value == Py_None ? py::object() : borrowed(value);
}

void set_recorder_helpers(py::object current_region, py::object call_signature, py::object end_region,
                          py::object lock, py::object open_regions, py::object pending_type, py::object array_type,
                          py::object strided_view_type, py::object fused, bool single_device) {
  auto name = [](const char* s) { return PyUnicode_InternFromString(s); };
  g_rec = {current_region.release().ptr(), call_signature.release().ptr(), end_region.release().ptr(),
           lock.release().ptr(), open_regions.release().ptr(), pending_type.release().ptr(),
           array_type.release().ptr(), strided_view_type.release().ptr(), fused.release().ptr(), single_device,
           name("calls"), name("structure"), name("inputs"), name("input_index"), name("outputs"), name("device"),
           name("ran"), name("aval"), name("value"), name("region"), name("slot"), name("shape"), name("static"),
           name("max ops"), name("_geometry"), name("buffer"), name("MAX_CALLS"), name("another thread"),
           name("host read"), name("dtype")};
  g_ready = true;
}

// A StridedView operand (storage.py): its buffer's aval and its geometry as key words; its
// leaves are the buffer and, unless the offset is 0 (static then, as StridedView.tree_flatten
// makes it), the offset's scalar (a constant of the signature: nullptr here).
bool CallRecorder::view_key(PyObject* view, Scratch& call) {
  py::object geometry = attr(view, g_rec.geometry);
  py::object buffer = attr(view, g_rec.buffer);
  if (!PyTuple_CheckExact(geometry.ptr()) || PyTuple_GET_SIZE(geometry.ptr()) != 6 || !is_value(buffer.ptr()))
    return false;  // a padded buffer's geometry, another buffer: fused.record
  call.key.insert(call.key.end(), {9, reinterpret_cast<intptr_t>(attr(buffer.ptr(), g_rec.aval).ptr())});
  for (int part = 0; part < 2; part++) {  // sizes, strides
    PyObject* dims = PyTuple_GET_ITEM(geometry.ptr(), part);
    if (!PyTuple_CheckExact(dims)) return false;
    call.key.push_back(PyTuple_GET_SIZE(dims));
    for (Py_ssize_t d = 0; d < PyTuple_GET_SIZE(dims); d++) call.key.push_back(PyLong_AsLongLong(PyTuple_GET_ITEM(dims, d)));
  }
  const int64_t offset = PyLong_AsLongLong(PyTuple_GET_ITEM(geometry.ptr(), 2));
  call.key.push_back(offset);  // (the view's static part depends on it)
  if (PyErr_Occurred()) throw python_error();
  for (int part = 3; part < 6; part++) call.key.push_back(reinterpret_cast<intptr_t>(PyTuple_GET_ITEM(geometry.ptr(), part)));
  call.leaves.push_back(buffer.ptr());  // the view holds it
  if (offset != 0) call.leaves.push_back(nullptr);
  return true;
}

// A PaddedOperand (ops/growth.py): its array's aval and its axis as key words; its leaves are
// the array and its length (a traced scalar: every call of a growing cache has another).
bool CallRecorder::padded_key(PyObject* operand, Scratch& call) {
  py::object array = attr(operand, g_growth.array);
  py::object length = attr(operand, g_growth.length);
  if (!is_value(array.ptr()) || !is_value(length.ptr())) return false;
  call.key.insert(call.key.end(), {11, reinterpret_cast<intptr_t>(attr(array.ptr(), g_rec.aval).ptr()),
                           attr(operand, g_growth.axis).cast<int64_t>()});
  call.leaves.push_back(array.ptr());  // the operand holds them
  call.leaves.push_back(length.ptr());
  return true;
}

// One operand (None, a StridedView, a PaddedOperand, an array or a Pending) as key words and
// leaves; false for anything else (fused.record then).
bool CallRecorder::operand_key(PyObject* leaf, Scratch& call) {
  if (leaf == Py_None) {  // an empty pytree: no leaf
    call.key.push_back(0);
    return true;
  }
  if (Py_TYPE(leaf) == reinterpret_cast<PyTypeObject*>(g_rec.strided_view_type)) return view_key(leaf, call);
  if (Py_TYPE(leaf) == reinterpret_cast<PyTypeObject*>(g_growth.padded_operand_type)) return padded_key(leaf, call);
  if (!is_value(leaf)) return false;
  PyObject* aval = Py_TYPE(leaf) == reinterpret_cast<PyTypeObject*>(g_rec.pending_type) ? g_pending.aval.get(leaf)
                                                                                        : attr(leaf, g_rec.aval).ptr();
  call.key.push_back(reinterpret_cast<intptr_t>(aval));  // held by the signature (an array's aval: by the array)
  call.leaves.push_back(leaf);
  return true;
}

static uint64_t g_signature_generation = 0;

void forget_recorded_signatures() { g_signature_generation++; }

void regions_moved() { g_region_epoch++; }

size_t CallRecorder::KeyHash::operator()(const std::vector<int64_t>& key) const {
  size_t h = key.size();
  for (int64_t w : key) h ^= std::hash<int64_t>()(w) + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
  return h;
}

PyObject* CallRecorder::record(const c10::IValue* args, PyObject* values, int device, const PaddedCall& padded,
                               PyObject** description) {
  if (!g_ready) return nullptr;
  const Py_ssize_t n = PyTuple_GET_SIZE(values);
  if (is_static_.empty()) {
    std::vector<bool> is_static(size_t(n), false);
    for (auto i : attr(recordable_, g_rec.static_)) is_static[i.cast<size_t>()] = true;
    if (is_static_.empty()) is_static_ = std::move(is_static);
  }
  // the signature: static arguments by value, operands by aval (the same aval object: the same signature)
  Scratch scratch;
  scratch.key.reserve(32);
  scratch.leaves.reserve(8);
  for (Py_ssize_t i = 0; i < n; i++) {
    if (is_static_[i]) {
      if (!static_key(args[i], scratch.key)) return nullptr;
      continue;
    }
    PyObject* leaf = PyTuple_GET_ITEM(values, i);
    if (PyList_CheckExact(leaf)) {  // a tensor list or a scalar list: its items in order, as a pytree flattens them
      const Py_ssize_t size = PyList_GET_SIZE(leaf);
      scratch.key.insert(scratch.key.end(), {10, int64_t(size)});
      for (Py_ssize_t k = 0; k < size; k++)
        if (!operand_key(PyList_GET_ITEM(leaf, k), scratch)) return nullptr;
      continue;
    }
    if (!operand_key(leaf, scratch)) return nullptr;
  }
  if (generation_ != g_signature_generation) {
    signatures_.clear();
    generation_ = g_signature_generation;
  }
  std::shared_ptr<const Signature> known;
  auto found = signatures_.find(scratch.key);
  if (found != signatures_.end()) {
    known = found->second;
  } else {
    PyObject* answer = PyObject_CallFunctionObjArgs(g_rec.call_signature, recordable_, values, nullptr);
    if (!answer) return nullptr;  // the call's error: the kernel's Python path raises it as CPU torch would
    py::object signature = py::reinterpret_steal<py::object>(answer);
    if (signature.is_none()) return nullptr;
    auto fresh = std::make_shared<Signature>();
    Signature& s = *fresh;
    s.call_id = signature[py::int_(0)];
    s.call_number = s.call_id.cast<int64_t>();
    s.treedef = signature[py::int_(1)];
    s.statics = signature[py::int_(2)];
    s.out_treedef = signature[py::int_(3)];
    s.unflatten = s.out_treedef.is_none() ? py::object(py::none()) : py::object(s.out_treedef.attr("unflatten"));
    for (auto aval : signature[py::int_(4)]) s.out_avals.push_back(py::reinterpret_borrow<py::object>(aval));
    py::list leaves = signature[py::int_(5)];
    if (size_t(py::len(leaves)) != scratch.leaves.size()) return nullptr;  // a pytree this recorder does not know
    for (size_t j = 0; j < scratch.leaves.size(); j++) {
      py::object leaf = scratch.leaves[j] ? py::reinterpret_borrow<py::object>(scratch.leaves[j]) : leaves[j];
      py::object aval = attr(leaf.ptr(), g_rec.aval);
      s.scalar.push_back(py::len(attr(aval.ptr(), g_rec.shape)) == 0);
      s.held.push_back(std::move(aval));
      s.constants.push_back(scratch.leaves[j] ? py::object() : leaf);
    }
    s.description = signature[py::int_(6)];
    if (signatures_.size() > 4096) signatures_.clear();
    signatures_[scratch.key] = fresh;
    known = std::move(fresh);
  }
  const Signature& s = *known;
  PyObject* described = s.description.ptr();
  if (padded.length >= 0) {  // an append onto a padded storage: recorded here only if it fits
    PyObject* grows_by = PyTuple_Check(described) && PyTuple_GET_SIZE(described) > 3
                             ? PyTuple_GET_ITEM(described, 3) : Py_None;
    if (grows_by == Py_None || padded.length + PyLong_AsLongLong(grows_by) > padded.capacity) return nullptr;
  }

  PyLockGuard lock(g_rec.lock);  // fused._lock: regions are shared with threads that run them
  PyObject* region = current_region();
  py::object calls = borrowed(g_region.calls.get(region));
  const Py_ssize_t recorded_calls = PyList_GET_SIZE(calls.ptr());
  if (!g_rec.single_device && recorded_calls) {
    py::object region_device = borrowed(g_region.device.get(region));
    if (!region_device.is_none() && region_device.cast<int>() != device) return nullptr;  // record ends the region
  }
  // each operand: the slot of a pending output of this region, or an input of the region
  std::vector<py::object> operands(scratch.leaves.size());
  for (size_t j = 0; j < scratch.leaves.size(); j++) {
    if (!scratch.leaves[j]) scratch.leaves[j] = s.constants[j].ptr();
    PyObject* leaf = scratch.leaves[j];
    if (Py_TYPE(leaf) == reinterpret_cast<PyTypeObject*>(g_rec.pending_type)) {
      py::object value = borrowed(g_pending.value.get(leaf));
      if (value.is_none() && g_pending.region.get(leaf) == region) {
        operands[j] = borrowed(g_pending.slot.get(leaf));
        continue;
      }
      if (value.is_none()) {  // another thread's region (backward reading the forward's): it runs first
        value = pending_value(leaf, g_rec.another_thread);
        if (!value) return nullptr;  // its region failed: fused.record raises that
        if (g_region.ran.get(region) == Py_True) return nullptr;  // this thread's region ran too: record anew
      }
      leaf = value.ptr();
      operands[j] = std::move(value);
      continue;
    }
    operands[j] = py::reinterpret_borrow<py::object>(leaf);
  }
  // nothing returns early from here on: the region takes the call
  py::object inputs = borrowed(g_region.inputs.get(region));
  py::object index = borrowed(g_region.input_index.get(region));
  py::tuple refs(scratch.leaves.size());
  for (size_t j = 0; j < scratch.leaves.size(); j++) {
    PyObject* operand = operands[j].ptr();
    if (PyLong_CheckExact(operand)) {  // a pending slot
      PyTuple_SET_ITEM(refs.ptr(), j, operands[j].release().ptr());
      continue;
    }
    Py_ssize_t k = PyList_GET_SIZE(inputs.ptr());
    // the same array twice is one input; a scalar is an input of its own (fused.record says why)
    bool scalar = s.scalar[j] || Py_TYPE(scratch.leaves[j]) == reinterpret_cast<PyTypeObject*>(g_rec.pending_type);
    if (!scalar) {
      py::object id = py::reinterpret_steal<py::object>(PyLong_FromVoidPtr(operand));
      PyObject* known = PyDict_GetItemWithError(index.ptr(), id.ptr());
      if (known) {
        k = PyLong_AsSsize_t(known);
      } else {
        if (PyErr_Occurred()) throw python_error();
        py::object position = py::reinterpret_steal<py::object>(PyLong_FromSsize_t(k));
        if (PyDict_SetItem(index.ptr(), id.ptr(), position.ptr()) < 0) throw python_error();
        if (PyList_Append(inputs.ptr(), operand) < 0) throw python_error();
      }
    } else if (PyList_Append(inputs.ptr(), operand) < 0) {
      throw python_error();
    }
    PyTuple_SET_ITEM(refs.ptr(), j, PyLong_FromSsize_t(-1 - k));
  }
  py::object outputs = borrowed(g_region.outputs.get(region));
  const Py_ssize_t base = PyList_GET_SIZE(outputs.ptr());
  const size_t n_out = s.out_avals.size();
  py::list outs(n_out);
  for (size_t j = 0; j < n_out; j++) {
    py::object pending = new_pending(s.out_avals[j].ptr(), region, base + Py_ssize_t(j));
    if (PyList_Append(outputs.ptr(), pending.ptr()) < 0) throw python_error();
    PyList_SET_ITEM(outs.ptr(), j, pending.release().ptr());
  }
  if (!recorded_calls && PySet_Add(g_rec.open_regions, region) < 0) throw python_error();
  py::tuple call = py::make_tuple(py::handle(recordable_), s.statics, s.treedef, refs, py::int_(n_out));
  if (PyList_Append(calls.ptr(), call.ptr()) < 0) throw python_error();
  py::tuple entry = py::make_tuple(s.call_id, refs);
  py::object structure = borrowed(g_region.structure.get(region));
  if (PyList_Append(structure.ptr(), entry.ptr()) < 0) throw python_error();
  digest_call(g_region.digest.get(region), s.call_number, refs.ptr());
  if (!g_rec.single_device) g_region.device.set(region, py::int_(device).ptr());
  recorded++;
  py::object result = s.unflatten.is_none() ? py::object(outs[0]) : s.unflatten(outs);
  if (recorded_calls + 1 >= attr(g_rec.fused, g_rec.max_calls).cast<Py_ssize_t>()) {
    end_region(region, g_rec.max_ops);
  }
  if (description) *description = py::object(s.description).release().ptr();
  return result.release().ptr();
}

}  // namespace torch_pjrt
