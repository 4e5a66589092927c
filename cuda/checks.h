// Argument checks for bindings.cpp. Each names the function, the argument, its value and the rule, e.g.
//   pytorch_block_sparse_ng._C.dsd: x must be a CUDA tensor, got a tensor on cpu
// Wrong dtypes raise TypeError, everything else ValueError (TORCH_CHECK_TYPE / TORCH_CHECK_VALUE).
//
// Messages are assembled by pbsng::cat (std::to_string for numbers), never by streaming numbers into an
// std::ostream: on the GPU machine's toolchain, c10::str with an integer argument crashed inside
// std::ostream::_M_insert<long> in this extension (seen 2026-11-22, torch 2.11, H200 image).
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <type_traits>

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

namespace pbsng {

inline void append(std::string& s, const char* v) { s += v; }
inline void append(std::string& s, const std::string& v) { s += v; }
inline void append(std::string& s, c10::ScalarType v) { s += c10::toString(v); }
inline void append(std::string& s, const c10::Device& v) { s += v.str(); }
template <class T, std::enable_if_t<std::is_integral_v<T>, int> = 0>
inline void append(std::string& s, T v) { s += std::to_string(v); }

template <class... Args>
std::string cat(const Args&... args) {
  std::string s;
  (append(s, args), ...);
  return s;
}

#define PBSNG_CHECK_VALUE(cond, ...) TORCH_CHECK_VALUE(cond, ::pbsng::cat(__VA_ARGS__))
#define PBSNG_CHECK_TYPE(cond, ...) TORCH_CHECK_TYPE(cond, ::pbsng::cat(__VA_ARGS__))

inline std::string shape_str(const at::Tensor& t) {
  std::string s = "(";
  for (int64_t i = 0; i < t.dim(); ++i) s += (i ? ", " : "") + std::to_string(t.size(i));
  return s + (t.dim() == 1 ? ",)" : ")");
}

inline std::string strides_str(const at::Tensor& t) {
  std::string s = "(";
  for (int64_t i = 0; i < t.dim(); ++i) s += (i ? ", " : "") + std::to_string(t.stride(i));
  return s + (t.dim() == 1 ? ",)" : ")");
}

inline void check_defined(const at::Tensor& t, const char* fn, const char* name) {
  PBSNG_CHECK_VALUE(t.defined(), fn, ": ", name, " must be a tensor, got None");
}

inline void check_cuda(const at::Tensor& t, const char* fn, const char* name) {
  check_defined(t, fn, name);
  PBSNG_CHECK_VALUE(t.is_cuda(), fn, ": ", name, " must be a CUDA tensor, got a tensor on ", t.device(),
                    " (this extension has no CPU kernels; pytorch_block_sparse_ng.reference computes on the CPU)");
}

inline void check_same_device(const at::Tensor& t, const at::Tensor& ref, const char* fn, const char* name,
                              const char* ref_name) {
  PBSNG_CHECK_VALUE(t.device() == ref.device(), fn, ": ", name, " is on ", t.device(), " but ", ref_name,
                    " is on ", ref.device(), "; all tensors must be on one device");
}

inline void check_float_dtype(const at::Tensor& t, const char* fn, const char* name) {
  PBSNG_CHECK_TYPE(t.scalar_type() == at::kHalf || t.scalar_type() == at::kBFloat16, fn, ": ", name,
                   ".dtype=", t.scalar_type(), " must be float16 or bfloat16");
}

inline void check_same_dtype(const at::Tensor& t, const at::Tensor& ref, const char* fn, const char* name,
                             const char* ref_name) {
  PBSNG_CHECK_TYPE(t.scalar_type() == ref.scalar_type(), fn, ": ", name, ".dtype=", t.scalar_type(),
                   " must equal ", ref_name, ".dtype=", ref.scalar_type());
}

inline void check_dim(const at::Tensor& t, int64_t dim, const char* fn, const char* name) {
  PBSNG_CHECK_VALUE(t.dim() == dim, fn, ": ", name, " must have ", dim, " dimensions, got shape ", shape_str(t));
}

inline void check_contiguous(const at::Tensor& t, const char* fn, const char* name) {
  PBSNG_CHECK_VALUE(t.is_contiguous(), fn, ": ", name, " must be contiguous (shape ", shape_str(t),
                    ", strides ", strides_str(t), "); call .contiguous() first");
}

// cp.async moves 16 bytes at a time.
inline void check_aligned(const at::Tensor& t, const char* fn, const char* name) {
  const auto address = reinterpret_cast<std::uintptr_t>(t.data_ptr());
  char hex[32];
  std::snprintf(hex, sizeof(hex), "0x%llx", static_cast<unsigned long long>(address));
  PBSNG_CHECK_VALUE(address % 16 == 0, fn, ": ", name, " must start at a 16-byte aligned address, got ",
                    std::string(hex), " (storage offset ", t.storage_offset(), "); pass a copy (.clone())");
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
  PBSNG_CHECK_TYPE(t.scalar_type() == at::kInt, fn, ": ", name, ".dtype=", t.scalar_type(), " must be int32");
  check_dim(t, 1, fn, name);
  check_contiguous(t, fn, name);
  PBSNG_CHECK_VALUE(t.numel() == numel, fn, ": ", name, " has ", t.numel(), " entries but must have ", numel,
                    " (", rule, ")");
}

}  // namespace pbsng
