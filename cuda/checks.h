// Argument checks for bindings.cpp. Each names the function, the argument, its value and the rule, e.g.
//   pytorch_block_sparse_ng._C.dsd: x must be a CUDA tensor, got a tensor on cpu
// Wrong dtypes raise TypeError, everything else ValueError (TORCH_CHECK_TYPE / TORCH_CHECK_VALUE).
#pragma once

#include <cstdint>
#include <string>

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

namespace pbsng {

inline std::string shape_str(const at::Tensor& t) {
  std::string s = "(";
  for (int64_t i = 0; i < t.dim(); ++i) s += (i ? ", " : "") + std::to_string(t.size(i));
  return s + (t.dim() == 1 ? ",)" : ")");
}

inline void check_defined(const at::Tensor& t, const char* fn, const char* name) {
  TORCH_CHECK_VALUE(t.defined(), fn, ": ", name, " must be a tensor, got None");
}

inline void check_cuda(const at::Tensor& t, const char* fn, const char* name) {
  check_defined(t, fn, name);
  TORCH_CHECK_VALUE(t.is_cuda(), fn, ": ", name, " must be a CUDA tensor, got a tensor on ", t.device(),
                    " (this extension has no CPU kernels; pytorch_block_sparse_ng.reference computes on the CPU)");
}

inline void check_same_device(const at::Tensor& t, const at::Tensor& ref, const char* fn, const char* name,
                              const char* ref_name) {
  TORCH_CHECK_VALUE(t.device() == ref.device(), fn, ": ", name, " is on ", t.device(), " but ", ref_name,
                    " is on ", ref.device(), "; all tensors must be on one device");
}

inline void check_float_dtype(const at::Tensor& t, const char* fn, const char* name) {
  TORCH_CHECK_TYPE(t.scalar_type() == at::kHalf || t.scalar_type() == at::kBFloat16, fn, ": ", name,
                   ".dtype=", t.scalar_type(), " must be float16 or bfloat16");
}

inline void check_same_dtype(const at::Tensor& t, const at::Tensor& ref, const char* fn, const char* name,
                             const char* ref_name) {
  TORCH_CHECK_TYPE(t.scalar_type() == ref.scalar_type(), fn, ": ", name, ".dtype=", t.scalar_type(),
                   " must equal ", ref_name, ".dtype=", ref.scalar_type());
}

inline void check_dim(const at::Tensor& t, int64_t dim, const char* fn, const char* name) {
  TORCH_CHECK_VALUE(t.dim() == dim, fn, ": ", name, " must have ", dim, " dimensions, got shape ", shape_str(t));
}

inline void check_contiguous(const at::Tensor& t, const char* fn, const char* name) {
  TORCH_CHECK_VALUE(t.is_contiguous(), fn, ": ", name, " must be contiguous (shape ", shape_str(t),
                    ", strides ", t.strides(), "); call .contiguous() first");
}

// cp.async moves 16 bytes at a time.
inline void check_aligned(const at::Tensor& t, const char* fn, const char* name) {
  const auto address = reinterpret_cast<std::uintptr_t>(t.data_ptr());
  TORCH_CHECK_VALUE(address % 16 == 0, fn, ": ", name, " must start at a 16-byte aligned address, got 0x",
                    std::hex, address, std::dec, " (storage offset ", t.storage_offset(), "); pass a copy (.clone())");
}

// A dense fp16/bf16 operand the kernels read with cp.async.
inline void check_operand(const at::Tensor& t, int64_t dim, const char* fn, const char* name) {
  check_cuda(t, fn, name);
  check_float_dtype(t, fn, name);
  check_dim(t, dim, fn, name);
  check_contiguous(t, fn, name);
  check_aligned(t, fn, name);
}

// An int32 index array of `numel` entries on the device of `ref`.
inline void check_index(const at::Tensor& t, int64_t numel, const at::Tensor& ref, const char* fn, const char* name,
                        const char* rule) {
  check_defined(t, fn, name);
  check_same_device(t, ref, fn, name, "the operands");
  TORCH_CHECK_TYPE(t.scalar_type() == at::kInt, fn, ": ", name, ".dtype=", t.scalar_type(), " must be int32");
  check_dim(t, 1, fn, name);
  check_contiguous(t, fn, name);
  TORCH_CHECK_VALUE(t.numel() == numel, fn, ": ", name, " has ", t.numel(), " entries but must have ", numel,
                    " (", rule, ")");
}

}  // namespace pbsng
