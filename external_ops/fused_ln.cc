// Paddle custom ops `fused_rms_norm` and `fused_ln` (module `fused_ln`):
// registration, shape/dtype inference, argument checks and the CPU kernels.
// The CUDA kernels live in fused_norm_kernels.cuh (called via fused_ln_cuda.cu
// when built with FUSED_LN_WITH_CUDA).
//
//   fused_rms_norm(x, scale, epsilon) -> (y, invvar)
//   fused_ln(x, scale, bias, epsilon) -> (y, mean, invvar)
//
// x: [..., hidden] float32/float16/bfloat16 (CPU also float64); scale, bias: [hidden], same dtype
// as x; y: like x; mean, invvar: float32 [rows], rows = numel(x) / hidden.
// All arithmetic is accumulated in float32.
#include <cmath>
#include <vector>

#include "paddle/extension.h"

#ifdef FUSED_LN_WITH_CUDA
std::vector<paddle::Tensor> NormForwardCUDA(const paddle::Tensor& x,
                                            const paddle::Tensor& scale,
                                            const paddle::Tensor* bias,
                                            float epsilon);
std::vector<paddle::Tensor> NormBackwardCUDA(const paddle::Tensor& x,
                                             const paddle::Tensor& scale,
                                             const paddle::Tensor* mean,
                                             const paddle::Tensor& invvar,
                                             const paddle::Tensor& dy);
#endif

namespace {

constexpr char kRebuildHint[] =
    "Rebuild the op against a CUDA build of paddle: python "
    "external_ops/setup.py install.";

void CheckArgs(const paddle::Tensor& x, const paddle::Tensor& scale,
               const paddle::Tensor* bias) {
  PD_CHECK(x.shape().size() >= 1,
           "fused_ln: x must have at least one dimension [..., hidden].");
  const int64_t hidden = x.shape().back();
  PD_CHECK(scale.shape().size() == 1 && scale.shape()[0] == hidden,
           "fused_ln: scale must have shape [hidden] = [", hidden,
           "]; reshape the weight to the last dimension of x.");
  PD_CHECK(scale.dtype() == x.dtype(),
           "fused_ln: scale dtype must equal x dtype; cast the weight to the "
           "input dtype.");
  PD_CHECK(scale.place() == x.place(),
           "fused_ln: x and scale must be on the same device.");
  if (bias != nullptr) {
    PD_CHECK(bias->shape().size() == 1 && bias->shape()[0] == hidden,
             "fused_ln: bias must have shape [hidden] = [", hidden, "].");
    PD_CHECK(bias->dtype() == x.dtype(),
             "fused_ln: bias dtype must equal x dtype; cast it to the input "
             "dtype.");
  }
}

template <typename T>
void ForwardCPU(const T* x, const T* scale, const T* bias, T* y, float* mean,
                float* invvar, int64_t rows, int64_t cols, float eps) {
  const float inv_cols = 1.f / static_cast<float>(cols);
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * cols;
    float mu = 0.f;
    if (bias != nullptr) {
      float s = 0.f;
      for (int64_t c = 0; c < cols; ++c) s += static_cast<float>(xr[c]);
      mu = s * inv_cols;
      mean[r] = mu;
    }
    float ss = 0.f;
    for (int64_t c = 0; c < cols; ++c) {
      const float d = static_cast<float>(xr[c]) - mu;
      ss += d * d;
    }
    const float rs = 1.f / std::sqrt(ss * inv_cols + eps);
    invvar[r] = rs;
    T* yr = y + r * cols;
    for (int64_t c = 0; c < cols; ++c) {
      float o = (static_cast<float>(xr[c]) - mu) * rs *
                static_cast<float>(scale[c]);
      if (bias != nullptr) o += static_cast<float>(bias[c]);
      yr[c] = static_cast<T>(o);
    }
  }
}

// dx = invvar * (g - [LN] mean(g) - xhat * mean(g * xhat)), g = dy * scale,
// xhat = (x - mean) * invvar; dscale = sum_rows dy * xhat; dbias = sum_rows dy.
template <typename T>
void BackwardCPU(const T* x, const T* scale, const float* mean,
                 const float* invvar, const T* dy, T* dx, T* dscale, T* dbias,
                 int64_t rows, int64_t cols) {
  const float inv_cols = 1.f / static_cast<float>(cols);
  std::vector<float> acc_w(cols, 0.f), acc_b(cols, 0.f);
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * cols;
    const T* dyr = dy + r * cols;
    const float rs = invvar[r];
    const float mu = mean != nullptr ? mean[r] : 0.f;
    float sum_g = 0.f, sum_gx = 0.f;
    for (int64_t c = 0; c < cols; ++c) {
      const float g = static_cast<float>(dyr[c]) * static_cast<float>(scale[c]);
      sum_g += g;
      sum_gx += g * (static_cast<float>(xr[c]) - mu) * rs;
    }
    const float mean_g = mean != nullptr ? sum_g * inv_cols : 0.f;
    const float mean_gx = sum_gx * inv_cols;
    T* dxr = dx + r * cols;
    for (int64_t c = 0; c < cols; ++c) {
      const float d = static_cast<float>(dyr[c]);
      const float xhat = (static_cast<float>(xr[c]) - mu) * rs;
      dxr[c] = static_cast<T>(
          rs * (d * static_cast<float>(scale[c]) - mean_g - xhat * mean_gx));
      acc_w[c] += d * xhat;
      acc_b[c] += d;
    }
  }
  for (int64_t c = 0; c < cols; ++c) {
    dscale[c] = static_cast<T>(acc_w[c]);
    if (dbias != nullptr) dbias[c] = static_cast<T>(acc_b[c]);
  }
}

std::vector<paddle::Tensor> NormForward(const paddle::Tensor& x,
                                        const paddle::Tensor& scale,
                                        const paddle::Tensor* bias,
                                        float epsilon) {
  CheckArgs(x, scale, bias);
  if (x.is_gpu()) {
#ifdef FUSED_LN_WITH_CUDA
    return NormForwardCUDA(x, scale, bias, epsilon);
#else
    PD_THROW("fused_ln was built without CUDA but got a GPU tensor. ",
             kRebuildHint);
#endif
  }
  PD_CHECK(x.is_cpu(), "fused_ln: x must be a CPU or GPU tensor.");
  const int64_t cols = x.shape().back();
  const int64_t rows = cols == 0 ? 0 : x.numel() / cols;
  auto y = paddle::empty(x.shape(), x.dtype(), x.place());
  auto invvar = paddle::empty({rows}, paddle::DataType::FLOAT32, x.place());
  auto mean = paddle::empty({rows}, paddle::DataType::FLOAT32, x.place());
  PD_DISPATCH_FLOATING_AND_HALF_TYPES(x.dtype(), "fused_ln_cpu", ([&] {
    ForwardCPU<data_t>(x.data<data_t>(), scale.data<data_t>(),
                       bias != nullptr ? bias->data<data_t>() : nullptr,
                       y.data<data_t>(), mean.data<float>(),
                       invvar.data<float>(), rows, cols, epsilon);
  }));
  if (bias == nullptr) return {y, invvar};
  return {y, mean, invvar};
}

std::vector<paddle::Tensor> NormBackward(const paddle::Tensor& x,
                                         const paddle::Tensor& scale,
                                         const paddle::Tensor* mean,
                                         const paddle::Tensor& invvar,
                                         const paddle::Tensor& dy) {
  if (x.is_gpu()) {
#ifdef FUSED_LN_WITH_CUDA
    return NormBackwardCUDA(x, scale, mean, invvar, dy);
#else
    PD_THROW("fused_ln was built without CUDA but got a GPU tensor. ",
             kRebuildHint);
#endif
  }
  const int64_t cols = x.shape().back();
  const int64_t rows = cols == 0 ? 0 : x.numel() / cols;
  auto dx = paddle::empty(x.shape(), x.dtype(), x.place());
  auto dscale = paddle::empty(scale.shape(), scale.dtype(), scale.place());
  auto dbias = paddle::empty(scale.shape(), scale.dtype(), scale.place());
  PD_DISPATCH_FLOATING_AND_HALF_TYPES(x.dtype(), "fused_ln_cpu", ([&] {
    BackwardCPU<data_t>(x.data<data_t>(), scale.data<data_t>(),
                        mean != nullptr ? mean->data<float>() : nullptr,
                        invvar.data<float>(), dy.data<data_t>(),
                        dx.data<data_t>(), dscale.data<data_t>(),
                        mean != nullptr ? dbias.data<data_t>() : nullptr, rows,
                        cols);
  }));
  if (mean == nullptr) return {dx, dscale};
  return {dx, dscale, dbias};
}

int64_t RowsOf(const std::vector<int64_t>& shape) {
  int64_t rows = 1;
  for (size_t i = 0; i + 1 < shape.size(); ++i) {
    if (shape[i] < 0) return -1;  // unknown at graph-build time
    rows *= shape[i];
  }
  return rows;
}

}  // namespace

std::vector<paddle::Tensor> RmsNormFwd(const paddle::Tensor& x,
                                       const paddle::Tensor& scale,
                                       float epsilon) {
  return NormForward(x, scale, nullptr, epsilon);
}

std::vector<paddle::Tensor> RmsNormBwd(const paddle::Tensor& x,
                                       const paddle::Tensor& scale,
                                       const paddle::Tensor& invvar,
                                       const paddle::Tensor& dy) {
  return NormBackward(x, scale, nullptr, invvar, dy);
}

std::vector<paddle::Tensor> LayerNormFwd(const paddle::Tensor& x,
                                         const paddle::Tensor& scale,
                                         const paddle::Tensor& bias,
                                         float epsilon) {
  return NormForward(x, scale, &bias, epsilon);
}

std::vector<paddle::Tensor> LayerNormBwd(const paddle::Tensor& x,
                                         const paddle::Tensor& scale,
                                         const paddle::Tensor& mean,
                                         const paddle::Tensor& invvar,
                                         const paddle::Tensor& dy) {
  return NormBackward(x, scale, &mean, invvar, dy);
}

std::vector<std::vector<int64_t>> RmsNormInferShape(
    const std::vector<int64_t>& x, const std::vector<int64_t>& scale) {
  return {x, {RowsOf(x)}};
}

std::vector<paddle::DataType> RmsNormInferDtype(const paddle::DataType& x,
                                                const paddle::DataType& scale) {
  return {x, paddle::DataType::FLOAT32};
}

std::vector<std::vector<int64_t>> LayerNormInferShape(
    const std::vector<int64_t>& x, const std::vector<int64_t>& scale,
    const std::vector<int64_t>& bias) {
  return {x, {RowsOf(x)}, {RowsOf(x)}};
}

std::vector<paddle::DataType> LayerNormInferDtype(
    const paddle::DataType& x, const paddle::DataType& scale,
    const paddle::DataType& bias) {
  return {x, paddle::DataType::FLOAT32, paddle::DataType::FLOAT32};
}

PD_BUILD_OP(fused_rms_norm)
    .Inputs({"x", "scale"})
    .Outputs({"y", "invvar"})
    .Attrs({"epsilon: float"})
    .SetKernelFn(PD_KERNEL(RmsNormFwd))
    .SetInferShapeFn(PD_INFER_SHAPE(RmsNormInferShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(RmsNormInferDtype));

PD_BUILD_GRAD_OP(fused_rms_norm)
    .Inputs({"x", "scale", "invvar", paddle::Grad("y")})
    .Outputs({paddle::Grad("x"), paddle::Grad("scale")})
    .SetKernelFn(PD_KERNEL(RmsNormBwd));

PD_BUILD_OP(fused_ln)
    .Inputs({"x", "scale", "bias"})
    .Outputs({"y", "mean", "invvar"})
    .Attrs({"epsilon: float"})
    .SetKernelFn(PD_KERNEL(LayerNormFwd))
    .SetInferShapeFn(PD_INFER_SHAPE(LayerNormInferShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(LayerNormInferDtype));

PD_BUILD_GRAD_OP(fused_ln)
    .Inputs({"x", "scale", "mean", "invvar", paddle::Grad("y")})
    .Outputs({paddle::Grad("x"), paddle::Grad("scale"), paddle::Grad("bias")})
    .SetKernelFn(PD_KERNEL(LayerNormBwd));
