// CUDA entry points of the fused_ln ops: maps paddle tensors and dtypes onto
// the Paddle-free kernels in fused_norm_kernels.cuh. Shapes and dtypes are
// checked in fused_ln.cc before these are called.
#include <vector>

#include "fused_norm_kernels.cuh"
#include "paddle/extension.h"

namespace {

template <typename T>
struct CudaType {
  using type = T;
};
template <>
struct CudaType<paddle::float16> {
  using type = __half;
};
template <>
struct CudaType<paddle::bfloat16> {
  using type = __nv_bfloat16;
};

template <typename T>
const typename CudaType<T>::type* Ptr(const paddle::Tensor& t) {
  return reinterpret_cast<const typename CudaType<T>::type*>(t.data<T>());
}

template <typename T>
typename CudaType<T>::type* MutPtr(paddle::Tensor& t) {
  return reinterpret_cast<typename CudaType<T>::type*>(t.data<T>());
}

void CheckCuda(cudaError_t err) {
  PD_CHECK(err == cudaSuccess, "fused_ln CUDA kernel failed: ",
           cudaGetErrorString(err),
           ". Check that the op was built for this GPU's architecture.");
}

}  // namespace

#define FUSED_LN_DISPATCH_CUDA(DTYPE, ...)                                    \
  switch (DTYPE) {                                                            \
    case paddle::DataType::FLOAT32: {                                         \
      using data_t = float;                                                   \
      __VA_ARGS__();                                                          \
      break;                                                                  \
    }                                                                         \
    case paddle::DataType::FLOAT16: {                                         \
      using data_t = paddle::float16;                                         \
      __VA_ARGS__();                                                          \
      break;                                                                  \
    }                                                                         \
    case paddle::DataType::BFLOAT16: {                                        \
      using data_t = paddle::bfloat16;                                        \
      __VA_ARGS__();                                                          \
      break;                                                                  \
    }                                                                         \
    default:                                                                  \
      PD_THROW("fused_ln on GPU supports float32, float16 and bfloat16; cast " \
               "the input to one of them.");                                  \
  }

std::vector<paddle::Tensor> NormForwardCUDA(const paddle::Tensor& x,
                                            const paddle::Tensor& scale,
                                            const paddle::Tensor* bias,
                                            float epsilon) {
  const int64_t cols = x.shape().back();
  const int64_t rows = cols == 0 ? 0 : x.numel() / cols;
  auto y = paddle::empty(x.shape(), x.dtype(), x.place());
  auto invvar = paddle::empty({rows}, paddle::DataType::FLOAT32, x.place());
  auto mean = paddle::empty({rows}, paddle::DataType::FLOAT32, x.place());
  FUSED_LN_DISPATCH_CUDA(x.dtype(), ([&] {
    CheckCuda(fused_norm::norm_forward(
        Ptr<data_t>(x), Ptr<data_t>(scale),
        bias != nullptr ? Ptr<data_t>(*bias) : nullptr, MutPtr<data_t>(y),
        mean.data<float>(), invvar.data<float>(), rows, cols, epsilon,
        bias == nullptr, x.stream()));
  }));
  if (bias == nullptr) return {y, invvar};
  return {y, mean, invvar};
}

std::vector<paddle::Tensor> NormBackwardCUDA(const paddle::Tensor& x,
                                             const paddle::Tensor& scale,
                                             const paddle::Tensor* mean,
                                             const paddle::Tensor& invvar,
                                             const paddle::Tensor& dy) {
  const int64_t cols = x.shape().back();
  const int64_t rows = cols == 0 ? 0 : x.numel() / cols;
  const bool rms = mean == nullptr;
  auto dx = paddle::empty(x.shape(), x.dtype(), x.place());
  auto dscale = paddle::empty(scale.shape(), scale.dtype(), scale.place());
  auto dbias = paddle::empty(scale.shape(), scale.dtype(), scale.place());
  FUSED_LN_DISPATCH_CUDA(x.dtype(), ([&] {
    using cuda_t = typename CudaType<data_t>::type;
    int64_t ws_elems = 0;
    CheckCuda(fused_norm::backward_workspace_elems<cuda_t>(rows, cols, rms,
                                                           &ws_elems));
    auto workspace =
        paddle::empty({ws_elems}, paddle::DataType::FLOAT32, x.place());
    CheckCuda(fused_norm::norm_backward(
        Ptr<data_t>(x), Ptr<data_t>(scale),
        rms ? nullptr : mean->data<float>(), invvar.data<float>(),
        Ptr<data_t>(dy), MutPtr<data_t>(dx), MutPtr<data_t>(dscale),
        rms ? nullptr : MutPtr<data_t>(dbias), workspace.data<float>(), rows,
        cols, rms, x.stream()));
  }));
  if (rms) return {dx, dscale};
  return {dx, dscale, dbias};
}
