// Nested tensors on pjrt, as far as torch's transformer fast path uses them: nn.TransformerEncoder
// in inference with a src_key_padding_mask packs its input into a nested tensor, runs each
// layer's `_transformer_encoder_layer_fwd` on it and pads the result back (`to_padded_tensor`);
// it does so on every device it accepts, PrivateUse1 included. A nested tensor is torch's
// NestedTensorImpl over an ordinary pjrt buffer, so these are ATen's own device-generic kernels
// (creation, metadata, padding), composing dense ops on the buffer. The packing from a mask and
// the layer itself are Python (eager/nested.py); every other op on the NestedTensorPrivateUse1
// key raises torch's "Could not run ... NestedTensorPrivateUse1" naming it.
#include <ATen/core/Tensor.h>
#include <ATen/ops/_nested_from_padded_native.h>
#include <ATen/ops/_nested_tensor_from_mask_left_aligned_native.h>
#include <ATen/ops/_nested_tensor_size_native.h>
#include <ATen/ops/_nested_tensor_storage_offsets_native.h>
#include <ATen/ops/_nested_tensor_strides_native.h>
#include <ATen/ops/_nested_view_from_buffer_native.h>
#include <ATen/ops/to_padded_tensor_native.h>
#include <c10/core/SymIntArrayRef.h>
#include <torch/library.h>

namespace torch_pjrt {
namespace {

at::Tensor to_padded_tensor(const at::Tensor& self, double padding, at::OptionalSymIntArrayRef output_size) {
  if (!output_size.has_value()) return at::native::NestedTensor_to_padded_tensor_generic(self, padding);
  return at::native::NestedTensor_to_padded_tensor_generic(self, padding, C10_AS_INTARRAYREF_SLOW(*output_size));
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_nested_view_from_buffer", TORCH_FN(at::native::_nested_view_from_buffer));
  m.impl("_nested_tensor_from_mask_left_aligned", TORCH_FN(at::native::NestedTensor_nested_tensor_from_mask_left_aligned));
  m.impl("_nested_from_padded", TORCH_FN(at::native::nested_from_padded_generic));
}

TORCH_LIBRARY_IMPL(aten, NestedTensorPrivateUse1, m) {
  m.impl("_nested_tensor_size", TORCH_FN(at::native::_nested_tensor_size));
  m.impl("_nested_tensor_strides", TORCH_FN(at::native::_nested_tensor_strides));
  m.impl("_nested_tensor_storage_offsets", TORCH_FN(at::native::_nested_tensor_storage_offsets));
  m.impl("to_padded_tensor", TORCH_FN(to_padded_tensor));
}

}  // namespace
}  // namespace torch_pjrt
