// Sparse COO tensors on pjrt: ATen's own device-generic kernels for the SparsePrivateUse1
// key. A COO tensor is torch's SparseTensorImpl holding its indices (sparse_dim x nnz, int64)
// and values (nnz x dense sizes) as ordinary pjrt tensors, so these kernels only build and
// read that metadata, or compose dense ops on indices and values (clone, copy, to_dense as
// zeros + add_). The kernels that compute (add.out with a dense result, _coalesce,
// sparse_mask, addmm, index_select, mul) are Python, in eager/sparse.py; every other op on
// the key reaches the fallback that names it (eager/fallback.py, refuse_sparse).
#include <ATen/core/Tensor.h>
#include <ATen/ops/_coalesced_native.h>
#include <ATen/ops/_dimI_native.h>
#include <ATen/ops/_dimV_native.h>
#include <ATen/ops/_indices_native.h>
#include <ATen/ops/_nnz_native.h>
#include <ATen/ops/_sparse_coo_tensor_with_dims_and_tensors_native.h>
#include <ATen/ops/_sparse_coo_tensor_with_dims_native.h>
#include <ATen/ops/_to_dense_native.h>
#include <ATen/ops/_values_native.h>
#include <ATen/ops/add_native.h>
#include <ATen/ops/clone_native.h>
#include <ATen/ops/copy_native.h>
#include <ATen/ops/copy_sparse_to_sparse_native.h>
#include <ATen/ops/dense_dim_native.h>
#include <ATen/ops/empty_native.h>
#include <ATen/ops/indices_native.h>
#include <ATen/ops/is_coalesced_native.h>
#include <ATen/ops/mm_native.h>
#include <ATen/ops/neg_native.h>
#include <ATen/ops/resize_as_sparse_native.h>
#include <ATen/ops/sparse_dim_native.h>
#include <ATen/ops/sparse_resize_and_clear_native.h>
#include <ATen/ops/sparse_resize_native.h>
#include <ATen/ops/values_native.h>
#include <ATen/ops/zero_native.h>
#include <torch/library.h>

namespace torch_pjrt {
namespace {

TORCH_LIBRARY_IMPL(aten, SparsePrivateUse1, m) {
  // creation and metadata
  m.impl("empty.memory_format", TORCH_FN(at::native::empty_sparse));
  m.impl("_sparse_coo_tensor_with_dims", TORCH_FN(at::native::new_with_dims_sparse));
  m.impl("_sparse_coo_tensor_with_dims_and_tensors", TORCH_FN(at::native::new_with_dims_and_tensor_sparse_symint));
  m.impl("_indices", TORCH_FN(at::native::_indices_sparse));
  m.impl("_values", TORCH_FN(at::native::_values_sparse));
  m.impl("indices", TORCH_FN(at::native::indices_sparse));
  m.impl("values", TORCH_FN(at::native::values_sparse));
  m.impl("_nnz", TORCH_FN(at::native::_nnz_sparse));
  m.impl("sparse_dim", TORCH_FN(at::native::sparse_dim_sparse));
  m.impl("dense_dim", TORCH_FN(at::native::dense_dim_sparse));
  m.impl("_dimI", TORCH_FN(at::native::sparse_dim_sparse));
  m.impl("_dimV", TORCH_FN(at::native::dense_dim_sparse));
  m.impl("is_coalesced", TORCH_FN(at::native::is_coalesced_sparse));
  m.impl("_coalesced_", TORCH_FN(at::native::_coalesced_sparse_));
  m.impl("sparse_resize_", TORCH_FN(at::native::sparse_resize_));
  m.impl("sparse_resize_and_clear_", TORCH_FN(at::native::sparse_resize_and_clear_));
  m.impl("resize_as_sparse_", TORCH_FN(at::native::resize_as_sparse_));
  // composed of dense ops on indices and values
  m.impl("zero_", TORCH_FN(at::native::zero_sparse_));
  m.impl("clone", TORCH_FN(at::native::clone_sparse));
  m.impl("copy_", TORCH_FN(at::native::copy_sparse_wrapper_));
  m.impl("copy_sparse_to_sparse_", TORCH_FN(at::native::copy_sparse_));
  m.impl("neg", TORCH_FN(at::native::neg_sparse));
  m.impl("neg_", TORCH_FN(at::native::neg_sparse_));
  m.impl("neg.out", TORCH_FN(at::native::neg_out_sparse));
  m.impl("_to_dense", TORCH_FN(at::native::sparse_to_dense));  // zeros + add_ (eager/sparse.py)
  m.impl("add.Tensor", TORCH_FN(at::native::add_sparse));      // -> add.out (eager/sparse.py)
  m.impl("add_.Tensor", TORCH_FN(at::native::add_sparse_));
  m.impl("mm", TORCH_FN(at::native::_sparse_mm));  // -> addmm (eager/sparse.py)
}

}  // namespace
}  // namespace torch_pjrt
