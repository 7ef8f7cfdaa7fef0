// What module.cpp and fast_path.cpp share: the functions that take or return Python
// objects. pybind11's object types only (no casters, which cost build time).
#pragma once

#include "runtime.h"

#include <pybind11/pytypes.h>

#include <unordered_map>

namespace c10 {
struct IValue;
}  // namespace c10

namespace torch_pjrt {

namespace py = pybind11;

// ---- module.cpp: a storage's JAX buffer, as storage.py sees it ----
// fused.Pending (runtime/fused.py): a buffer that is a recorded call's output. Once its
// region ran, `settled` swaps in its array, so later reads are plain arrays again.
extern PyObject* g_pending_type;
void settle(Holder* h);
inline bool is_pending(PyObject* o) { return g_pending_type && Py_TYPE(o) == reinterpret_cast<PyTypeObject*>(g_pending_type); }
// The buffer if `t` is exactly its storage's buffer, else None.
py::object whole_buffer(const at::Tensor& t);
py::object buffer(const at::Tensor& t);  // the storage's buffer, None while uninitialised
// Replace the storage's buffer; `shape` and `dtype` describe the new buffer.
void set_buffer(const at::Tensor& t, py::object obj, std::vector<int64_t> shape, c10::ScalarType dtype);
// Whether `t` is exactly its storage's buffer and that buffer an append's exact result (Holder::appended).
bool appended(const at::Tensor& t);
void set_appended(const at::Tensor& t);
// A fresh contiguous pjrt tensor owning `obj` (a JAX array of that shape and dtype).
at::Tensor wrap(py::object obj, std::vector<int64_t> shape, c10::ScalarType dtype, c10::DeviceIndex device);
at::Tensor wrap_array(py::object array, c10::DeviceIndex device);  // wrap(), reading shape and dtype here
void set_dtype_map(py::dict jax_to_torch);  // JAX dtype -> torch dtype (the one mapping lives in dtypes.py)
int64_t storage_nbytes(const at::Tensor& t);
bool deterministic_fill(const at::Tensor& t);  // Holder::deterministic_fill

// A JAX array's shape and torch dtype, cached by its abstract value.
struct ArrayType {
  PyObject* aval = nullptr;  // owned
  std::vector<int64_t> shape;
  c10::ScalarType dtype = c10::ScalarType::Undefined;
};
const ArrayType& array_type(const py::object& array);
// True when `t` is exactly its storage's buffer (same shape, dtype, offset 0, contiguous,
// no lazy conj/neg bit): the zero-cost read of the eager hot path.
bool is_whole_buffer(const at::Tensor& t, const Holder* h);
// True when `t` covers its whole storage in row-major order with the buffer's dtype (its buffer
// or a reshape of it: a bias gradient (96,) over a (1, 96) sum): a write of all of `t` replaces
// the buffer, as storage.write does.
bool is_whole_storage(const at::Tensor& t, const Holder* h);

// ---- __slots__ attributes read and written at their offsets ----
// The hot path reads and writes the attributes of a few __slots__ classes of ours (fused.Pending
// and fused.Region, storage's buffers) for every call; through PyObject_GetAttr each costs a type
// lookup and a descriptor call. A slot is a PyMemberDef at a fixed offset in the instance, so
// the path reads and writes it there, on objects whose exact type it checked.
struct Slot {
  Py_ssize_t offset = -1;
  const char* name = "";  // for the error that names an unset one (a string literal)
  static Slot of(PyObject* type, const char* name);  // the member `name` of a __slots__ class
  PyObject* get(PyObject* o) const;                    // borrowed; raises AttributeError where unset
  void set(PyObject* o, PyObject* value) const;        // a new reference to `value`
};
struct PendingSlots {
  Slot aval, value, region, slot, replaces;
};
extern PendingSlots g_pending;  // set with g_pending_type

// ---- recorder.cpp: fused eager's recorder for fast kernels' calls ----
// o.name (an interned name), a new reference; raises the Python error as a C++ exception.
py::object attr(PyObject* o, PyObject* name);
// An instance of a __slots__ class with `slots` (name, value) set, made without running its
// __init__ (no bytecode runs, so no other thread runs meanwhile).
py::object new_slotted(PyObject* type, std::initializer_list<std::pair<PyObject*, PyObject*>> slots);
// storage.StridedView(buffer, geometry) for an array or Pending buffer; a null object otherwise.
py::object strided_view(PyObject* buffer, PyObject* geometry);
// storage.StridedView of `geometry` over a padded storage's buffer (storage.Padded): over its
// padded array where the view steps along the value's coordinates (a growing tensor's last token:
// one executable per capacity, not per length), else over the Padded (the consumer reads the
// exact value). storage.view_of and the fast path's views both take it from here.
py::object padded_view(PyObject* padded, PyObject* geometry);
void set_recorder_helpers(py::object current_region, py::object call_signature, py::object end_region,
                          py::object lock, py::object open_regions, py::object pending_type, py::object array_type,
                          py::object strided_view_type, py::object fused, bool single_device);

// A Python lock (threading.Lock or RLock) held for a scope, released with a pending error kept.
class PyLockGuard {
 public:
  explicit PyLockGuard(PyObject* lock);
  ~PyLockGuard();

 private:
  PyObject* lock_;
};

// fused._run's plan of a region it runs: (the outputs someone besides the region's list holds,
// the inputs it can donate: arrays only its list holds, each paired with a live output of the
// same shape and dtype, which XLA can write in place), as two tuples of positions. An output
// that replaced an input as a storage's buffer (Pending.replaces) is paired with it; the live
// outputs are ordered so that JAX's donation (each output takes the first donated input of its
// shape and dtype, in order) makes exactly these pairs: an in-place update needs no copy.
py::tuple region_plan(py::list outputs, py::list inputs, py::dict input_index);
// Fold a recorded call (its call id, its operands' refs: a tuple of ints) into its region's digest
// (Region.digest, a 16-byte bytearray), as both recorders record it.
void digest_call(PyObject* digest, int64_t call_id, PyObject* refs);
// Run `region` (fused.Region) if its executable is cached, from C++: fused._run's steady path
// (the plan, the executable by its key, the call, the outputs bound, the bookkeeping). False, and
// nothing done, for anything else (a first sight, a compile, another device): fused._run's.
// The caller holds fused._lock.
bool run_cached_region(PyObject* region, PyObject* reason);
// Run this thread's region, if it holds calls (fused.flush: a sync point named `reason`, "host read" when null).
void flush_region(PyObject* reason = nullptr);
// End `region` at a sync point named `reason`: run_cached_region, else fused.end_region.
void end_region(PyObject* region, PyObject* reason);
// A safe point (fast_path.cpp; runtime/safe_point.py): release JAX's executables if due, and drop
// the caches of traces if torch's default dtype changed since they were made.
void safe_point();
// A Pending's array, running its region first where it has not run (a sync point named `reason`,
// "host read" when null); null where the region failed (its error was raised then).
py::object pending_value(PyObject* pending, PyObject* reason = nullptr);
// A storage's buffer replaced by `now` (a Pending) where it was `before` (an array): the
// Pending remembers which (Pending.replaces), for region_plan.
void note_replaced(PyObject* now, PyObject* before);

// Growing storages (ops/growth.py, storage.py): their Python types and storage.offset_operand.
struct GrowthHelpers {
  PyObject* padded_type = nullptr;          // storage.Padded: a padded storage's buffer
  PyObject* padded_operand_type = nullptr;  // growth.PaddedOperand: a padded operand as a lowering takes it
  PyObject* offset_operand = nullptr;       // storage.offset_operand: a length as a cached int64 device scalar
  PyObject *array, *axis, *length;           // interned attribute names
};
extern GrowthHelpers g_growth;
void set_growth_helpers(py::object padded_type, py::object padded_operand_type, py::object offset_operand);

// A padded operand of a call (a KV cache appended to): its length and capacity along its axis.
struct PaddedCall {
  int64_t length = -1;  // -1: the call has no padded operand
  int64_t capacity = 0;
};

// One fast kernel's recorder: the call signatures it has recorded (fused.call_signature's answers).
class CallRecorder {
 public:
  explicit CallRecorder(PyObject* recordable) : recordable_(recordable) {}
  // Record recordable(*values) (args: the same arguments as the dispatcher gave them) into this
  // thread's region: its outputs (a Pending, or their pytree), a new reference. nullptr where
  // fused.record must record the call instead: with an error set, the call's own error.
  // `padded`: the call's padded operand, if any; the signature's description says how much the
  // padded result grows (kernels.SignatureTraits.grows_by), and a call whose result would not fit
  // the operand's capacity is left to the Python kernel (it grows the storage). `description`,
  // where given: the signature's description (Recordable.describe), a new reference, for a
  // recorded call.
  // Threads share a recorder (one per kernel) and a call can wait without the GIL (for fused._lock,
  // in a region's run), so a call's state lives on its own stack, never in the recorder.
  PyObject* record(const c10::IValue* args, PyObject* values, int device, const PaddedCall& padded = {},
                   PyObject** description = nullptr);
  int64_t recorded = 0;  // calls recorded here

 private:
  struct Signature {
    py::object call_id, treedef, statics, out_treedef;
    py::object unflatten;  // out_treedef.unflatten, looked up once (None: one output)
    int64_t call_number = 0;  // call_id's value (the region's digest folds it)
    std::vector<py::object> out_avals;
    std::vector<py::object> held;  // the operand avals whose addresses the key holds
    std::vector<bool> scalar;      // per operand: a 0-d array (an input of its own)
    std::vector<py::object> constants;  // per operand: the signature's own value (a view's offset scalar), or null
    py::object description;  // Recordable.describe(args) on first sight (None without one)
  };
  struct Scratch {  // one call's signature key and operands (arrays and Pendings; null: a constant)
    std::vector<int64_t> key;
    std::vector<PyObject*> leaves;  // borrowed from the call's `values`, which holds them
  };
  static bool view_key(PyObject* view, Scratch& call);
  static bool padded_key(PyObject* operand, Scratch& call);
  static bool operand_key(PyObject* leaf, Scratch& call);
  struct KeyHash {
    size_t operator()(const std::vector<int64_t>& key) const;
  };
  PyObject* recordable_;  // fused.Recordable
  std::vector<bool> is_static_;  // per argument: a static argument of the recordable
  // never freed, as the kernels are not: their Python objects must outlive the interpreter's end
  // (shared: a call keeps its signature while another thread clears the table)
  std::unordered_map<std::vector<int64_t>, std::shared_ptr<const Signature>, KeyHash>& signatures_ =
      *new std::unordered_map<std::vector<int64_t>, std::shared_ptr<const Signature>, KeyHash>();
  uint64_t generation_ = 0;  // forget_recorded_signatures() calls seen: a new one clears signatures_
};

// ---- fast_path.cpp ----
void set_eager_helpers(py::object weak_scalar, py::object read_lazily, py::object record, py::object array_type,
                       py::object strided_view, py::object record_call, py::object pending_type,
                       py::dict torch_to_jax);
// index_checks.py's queue, seen flags, their lock, _nothing_seen, raise_pending and the queue's bound:
// a checked fast kernel (an indexing op) queues its call's checks as index_checks.run_checked does.
void set_index_check_helpers(py::object lock, py::dict seen, py::list queued, py::object nothing_seen,
                             py::object raise_pending, py::object raise_if_found, Py_ssize_t max_queued);
void set_fused(bool fused);  // fast kernels record (fused.Recordable) instead of running their executable
// Self's storage takes `result` (an array or a Pending) as its buffer when it is exactly self's
// new value (self is its whole storage, same shape and dtype); false, and nothing done, otherwise.
bool store_whole(const at::Tensor& self, const py::object& result);
// Register the C++ kernel of `ns`::`name` (e.g. "aten", "add.Tensor") on PrivateUse1.
void register_fast_kernel(const std::string& ns, const std::string& name, py::object run, py::object recorded,
                          py::object slow, py::object store, std::vector<int> kinds, bool described, bool checked,
                          bool grows);
// aten::clone's C++ kernel (CloneKernel): `read_view` (its fused.Recordable `recorded_read_view`)
// reads a view; `slow` (transfer.clone) serves the other calls.
void register_clone_kernel(py::object read_view, py::object recorded_read_view, py::object slow);
// aten::_to_copy's C++ kernel (ToCopyKernel): the op table's lowering (`run`, `recorded`, with
// the argument `kinds` of its fast plan) for a row-major copy on the tensor's own device; `slow`
// (transfer.to_copy, positional) serves the other calls.
// ToCopyKernel's uploads: `put` (platform.put) and `facts` (transfer.device_facts).
void set_transfer_helpers(py::object put, py::object facts);
void register_to_copy_kernel(py::object run, py::object recorded, py::object slow, std::vector<int> kinds);
// aten::_local_scalar_dense's C++ kernel (ScalarReadKernel): a storage of at most `max_elements`
// elements is read on the host; `slow` (transfer.local_scalar_dense, a Python number) serves the rest.
void register_scalar_read_kernel(py::object slow, int64_t max_elements);
// Every recorder drops its signatures before its next call (traces made under another default dtype).
void forget_recorded_signatures();
void regions_moved();  // threads record into other regions now (fused.lend_region): ask fused again
// What safe_point calls: executable_budget.py's state dict and release_if_due, default_dtype.check.
void set_safe_point(py::dict budget_state, py::object release_if_due, py::object check_default_dtype);
// Per fast kernel ("aten::add.Tensor"): (calls served in C++, calls that entered its Python kernel,
// calls recorded in C++).
py::dict fast_path_counts();
void reset_fast_path_counts();
// SDPA's backend choice (fast_path.cpp's sdp_choice) asks `active()` whether torch's context_parallel() is on.
void set_ring_attention_active(py::function active);

}  // namespace torch_pjrt
