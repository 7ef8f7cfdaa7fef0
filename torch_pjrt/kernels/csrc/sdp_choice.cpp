// The pjrt entry of scaled_dot_product_attention's backend choice.
//
// torch's SDPA (a CompositeImplicitAutograd op) asks `_fused_sdp_choice_stub` which
// backend serves the query's device type; a PrivateUse1 backend can only register that
// stub from C++. Ours asks a Python callable (torch_pjrt.kernels.sdpa.choose), so the
// rule stays next to the flash-attention kernel it selects. With no callable set, or for
// a callable that fails, the math path is chosen (the error is raised, not hidden).
#include <torch/extension.h>
#include <ATen/native/transformers/attention.h>
#include <ATen/native/transformers/sdp_utils_cpp.h>

namespace {

PyObject* g_choose = nullptr;  // owned reference; never released (lives as long as the process)

int64_t choose(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
               const std::optional<at::Tensor>& attn_mask, double dropout_p, bool is_causal,
               std::optional<double> scale, bool enable_gqa) {
  if (g_choose == nullptr) {
    return static_cast<int64_t>(sdp::SDPBackend::math);
  }
  pybind11::gil_scoped_acquire gil;
  pybind11::object result = pybind11::reinterpret_borrow<pybind11::function>(g_choose)(
      query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa);
  return result.cast<int64_t>();
}

void set_choice(pybind11::function fn) {
  PyObject* old = g_choose;
  g_choose = fn.release().ptr();
  Py_XDECREF(old);
}

}  // namespace

namespace at::native {
REGISTER_PRIVATEUSE1_DISPATCH(_fused_sdp_choice_stub, &choose);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("set_choice", &set_choice, "Set the Python callable that picks the SDPA backend for pjrt tensors");
}
