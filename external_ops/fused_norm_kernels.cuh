// Fused RMSNorm / LayerNorm CUDA kernels. Paddle-free: this header only needs
// the CUDA runtime, so both the Paddle op (fused_ln_cuda.cu) and the standalone
// C-ABI harness (harness/fused_norm_capi.cu) include it.
//
// Layout: x, y, dy, dx are row-major [rows, cols]; scale, bias are [cols];
// mean, invvar are float32 [rows]. Element types: float, __half, __nv_bfloat16.
// All arithmetic and reductions run in float32.
//
// Work split: a "group" of THREADS threads owns one row at a time (a warp when
// cols <= 1024, otherwise a 256-thread block), loads VEC elements per access
// (16-byte vectors when every pointer is 16-byte aligned and cols % VEC == 0,
// scalar otherwise, so any cols is correct), and strides over rows.
//
// Backward writes per-group column partials of dscale (and dbias) into a
// float32 workspace [partial_rows, cols] (LayerNorm: two such planes), then a
// column-sum kernel reduces them into dscale/dbias. Each column of a partial
// row is touched by exactly one thread, so no atomics or barriers are needed;
// partials accumulate in shared memory when they fit in 48 KiB (less the
// kernel's static shared memory), otherwise directly in the workspace.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace fused_norm {

template <typename T>
__device__ __forceinline__ float to_float(T v);
template <>
__device__ __forceinline__ float to_float<float>(float v) { return v; }
template <>
__device__ __forceinline__ float to_float<__half>(__half v) {
  return __half2float(v);
}
template <>
__device__ __forceinline__ float to_float<__nv_bfloat16>(__nv_bfloat16 v) {
  return __bfloat162float(v);
}

template <typename T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) { return v; }
template <>
__device__ __forceinline__ __half from_float<__half>(float v) {
  return __float2half_rn(v);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

template <typename T, int VEC>
struct alignas(sizeof(T) * VEC) Pack {
  T v[VEC];
};

// One load or store instruction per pack. A plain store of a 16-byte pack (or
// of a uint4 holding it) is split by the compiler into 2- or 4-byte stores in
// unrolled loops, so 16-byte packs are stored with the __stwb intrinsic (a
// st.global.wb.v4, the default caching), other packs as a word of their size.
template <int BYTES>
struct Word;
template <>
struct Word<2> {
  using type = uint16_t;
};
template <>
struct Word<4> {
  using type = uint32_t;
};
template <>
struct Word<8> {
  using type = uint2;
};
template <>
struct Word<16> {
  using type = uint4;
};

template <typename T, int VEC>
__device__ __forceinline__ void load_vec(const T* p, float (&out)[VEC]) {
  using W = typename Word<sizeof(Pack<T, VEC>)>::type;
  const W w = *reinterpret_cast<const W*>(p);
  Pack<T, VEC> pk;
  memcpy(&pk, &w, sizeof(W));
#pragma unroll
  for (int i = 0; i < VEC; ++i) out[i] = to_float<T>(pk.v[i]);
}

template <typename T, int VEC>
__device__ __forceinline__ void store_vec(T* p, const float (&in)[VEC]) {
  using W = typename Word<sizeof(Pack<T, VEC>)>::type;
  Pack<T, VEC> pk;
#pragma unroll
  for (int i = 0; i < VEC; ++i) pk.v[i] = from_float<T>(in[i]);
  W w;
  memcpy(&w, &pk, sizeof(W));
  if constexpr (sizeof(W) == 16)
    __stwb(reinterpret_cast<W*>(p), w);
  else
    *reinterpret_cast<W*>(p) = w;
}

// Sum of v over the THREADS threads of a group. THREADS == 32: one warp, no
// barrier. THREADS > 32: the group is the whole block (all threads must call).
template <int THREADS>
__device__ __forceinline__ float group_sum(float v, float* red) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if (THREADS <= 32) return v;
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  __syncthreads();  // previous readers of red[] are done
  if (lane == 0) red[warp] = v;
  __syncthreads();
  v = lane < THREADS / 32 ? red[lane] : 0.f;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Forward. RMS: y = x * invvar * scale, invvar = rsqrt(mean(x^2) + eps).
// LayerNorm: y = (x - mean) * invvar * scale + bias, invvar =
// rsqrt(mean((x - mean)^2) + eps). mean is only written for LayerNorm.
template <typename T, int VEC, int THREADS, bool RMS>
__global__ void norm_fwd_kernel(const T* __restrict__ x,
                                const T* __restrict__ scale,
                                const T* __restrict__ bias, T* __restrict__ y,
                                float* __restrict__ mean_out,
                                float* __restrict__ invvar_out, int64_t rows,
                                int64_t cols, float eps) {
  __shared__ float red[32];
  const int groups = blockDim.x / THREADS;
  const int tid = threadIdx.x % THREADS;
  const int64_t step = static_cast<int64_t>(THREADS) * VEC;
  const float inv_cols = 1.f / static_cast<float>(cols);
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * groups +
                     threadIdx.x / THREADS;
       row < rows; row += static_cast<int64_t>(gridDim.x) * groups) {
    const T* xr = x + row * cols;
    float mu = 0.f;
    if (!RMS) {
      float s = 0.f;
      for (int64_t c = static_cast<int64_t>(tid) * VEC; c < cols; c += step) {
        float v[VEC];
        load_vec<T, VEC>(xr + c, v);
#pragma unroll
        for (int i = 0; i < VEC; ++i) s += v[i];
      }
      mu = group_sum<THREADS>(s, red) * inv_cols;
    }
    float ss = 0.f;
    for (int64_t c = static_cast<int64_t>(tid) * VEC; c < cols; c += step) {
      float v[VEC];
      load_vec<T, VEC>(xr + c, v);
#pragma unroll
      for (int i = 0; i < VEC; ++i) ss += (v[i] - mu) * (v[i] - mu);
    }
    const float r = rsqrtf(group_sum<THREADS>(ss, red) * inv_cols + eps);
    if (tid == 0) {
      invvar_out[row] = r;
      if (!RMS) mean_out[row] = mu;
    }
    T* yr = y + row * cols;
    for (int64_t c = static_cast<int64_t>(tid) * VEC; c < cols; c += step) {
      float v[VEC], w[VEC], b[VEC], o[VEC];
      load_vec<T, VEC>(xr + c, v);
      load_vec<T, VEC>(scale + c, w);
      if (!RMS) load_vec<T, VEC>(bias + c, b);
#pragma unroll
      for (int i = 0; i < VEC; ++i)
        o[i] = (v[i] - mu) * r * w[i] + (RMS ? 0.f : b[i]);
      store_vec<T, VEC>(yr + c, o);
    }
  }
}

// Forward with the row held in registers, for rows of at most
// CHUNKS * THREADS * VEC elements: each thread loads its CHUNKS vectors of the
// row once, before the first reduction, so all loads of a row are in flight
// together and x is read once (norm_fwd_kernel reads it again, from cache, in
// each pass). Same results as norm_fwd_kernel.
template <typename T, int VEC, int THREADS, int CHUNKS, bool RMS>
__global__ void norm_fwd_cached_kernel(const T* __restrict__ x,
                                       const T* __restrict__ scale,
                                       const T* __restrict__ bias,
                                       T* __restrict__ y,
                                       float* __restrict__ mean_out,
                                       float* __restrict__ invvar_out,
                                       int64_t rows, int64_t cols, float eps) {
  __shared__ float red[32];
  const int groups = blockDim.x / THREADS;
  const int tid = threadIdx.x % THREADS;
  const float inv_cols = 1.f / static_cast<float>(cols);
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * groups +
                     threadIdx.x / THREADS;
       row < rows; row += static_cast<int64_t>(gridDim.x) * groups) {
    const T* xr = x + row * cols;
    float v[CHUNKS][VEC];
#pragma unroll
    for (int k = 0; k < CHUNKS; ++k) {
      const int64_t c = static_cast<int64_t>(tid + k * THREADS) * VEC;
      if (c < cols) {
        load_vec<T, VEC>(xr + c, v[k]);
      } else {
#pragma unroll
        for (int i = 0; i < VEC; ++i) v[k][i] = 0.f;
      }
    }
    float mu = 0.f;
    if (!RMS) {
      float s = 0.f;
#pragma unroll
      for (int k = 0; k < CHUNKS; ++k) {
#pragma unroll
        for (int i = 0; i < VEC; ++i) s += v[k][i];
      }
      mu = group_sum<THREADS>(s, red) * inv_cols;
    }
    float ss = 0.f;
#pragma unroll
    for (int k = 0; k < CHUNKS; ++k) {
      if (static_cast<int64_t>(tid + k * THREADS) * VEC < cols) {
#pragma unroll
        for (int i = 0; i < VEC; ++i) ss += (v[k][i] - mu) * (v[k][i] - mu);
      }
    }
    const float r = rsqrtf(group_sum<THREADS>(ss, red) * inv_cols + eps);
    if (tid == 0) {
      invvar_out[row] = r;
      if (!RMS) mean_out[row] = mu;
    }
    T* yr = y + row * cols;
#pragma unroll
    for (int k = 0; k < CHUNKS; ++k) {
      const int64_t c = static_cast<int64_t>(tid + k * THREADS) * VEC;
      if (c < cols) {
        float w[VEC], b[VEC], o[VEC];
        load_vec<T, VEC>(scale + c, w);
        if (!RMS) load_vec<T, VEC>(bias + c, b);
#pragma unroll
        for (int i = 0; i < VEC; ++i)
          o[i] = (v[k][i] - mu) * r * w[i] + (RMS ? 0.f : b[i]);
        store_vec<T, VEC>(yr + c, o);
      }
    }
  }
}

// Backward. With xhat = (x - mean) * invvar and g = dy * scale:
//   dx = invvar * (g - [LN] mean(g) - xhat * mean(g * xhat))
//   dscale partial += dy * xhat, dbias partial += dy (LayerNorm only).
// partial: [partial_rows, cols] float32 per plane; plane 1 (dbias) follows
// plane 0 at offset partial_rows * cols. Group gi of block b owns partial row
// b * groups + gi.
//
// Each thread owns the same VEC columns of every row per chunk, and reads and
// writes their accumulators as float4 when VEC >= 4 (scalar otherwise).
// use_smem: the accumulators live in dynamic shared memory, groups * planes *
// cols floats in column order, and are copied to `partial` at the end;
// otherwise they accumulate in `partial` directly.
template <int W>
__device__ __forceinline__ void acc_add(float* p, const float* v) {
  if constexpr (W == 4) {
    float4 a = *reinterpret_cast<float4*>(p);
    a.x += v[0];
    a.y += v[1];
    a.z += v[2];
    a.w += v[3];
    *reinterpret_cast<float4*>(p) = a;
  } else {
    p[0] += v[0];
  }
}

template <int W>
__device__ __forceinline__ void acc_copy(float* dst, const float* src) {
  if constexpr (W == 4)
    *reinterpret_cast<float4*>(dst) = *reinterpret_cast<const float4*>(src);
  else
    dst[0] = src[0];
}

template <typename T, int VEC, int THREADS, bool RMS>
__global__ void norm_bwd_kernel(const T* __restrict__ x,
                                const T* __restrict__ scale,
                                const float* __restrict__ mean_in,
                                const float* __restrict__ invvar_in,
                                const T* __restrict__ dy, T* __restrict__ dx,
                                float* __restrict__ partial, int64_t rows,
                                int64_t cols, int64_t partial_rows,
                                bool use_smem) {
  extern __shared__ float4 dyn_smem[];
  __shared__ float red[32];
  constexpr int W = VEC >= 4 ? 4 : 1;  // floats per accumulator access
  const int groups = blockDim.x / THREADS;
  const int gi = threadIdx.x / THREADS;
  const int tid = threadIdx.x % THREADS;
  const int64_t step = static_cast<int64_t>(THREADS) * VEC;
  const float inv_cols = 1.f / static_cast<float>(cols);
  const int64_t prow = static_cast<int64_t>(blockIdx.x) * groups + gi;
  const int planes = RMS ? 1 : 2;
  float* const out_w = partial + prow * cols;  // this group's partial row
  float* acc_w;
  int64_t plane_stride;
  if (use_smem) {
    acc_w = reinterpret_cast<float*>(dyn_smem) + gi * planes * cols;
    plane_stride = cols;
  } else {
    acc_w = out_w;
    plane_stride = partial_rows * cols;
  }
  float* const acc_b = acc_w + plane_stride;
  const float zero[VEC] = {};
  for (int64_t c = static_cast<int64_t>(tid) * VEC; c < cols; c += step) {
#pragma unroll
    for (int j = 0; j < VEC; j += W) {
      acc_copy<W>(acc_w + c + j, zero + j);
      if (!RMS) acc_copy<W>(acc_b + c + j, zero + j);
    }
  }
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * groups + gi;
       row < rows; row += static_cast<int64_t>(gridDim.x) * groups) {
    const T* xr = x + row * cols;
    const T* dyr = dy + row * cols;
    const float r = invvar_in[row];
    const float mu = RMS ? 0.f : mean_in[row];
    float sum_g = 0.f, sum_gx = 0.f;
    for (int64_t c = static_cast<int64_t>(tid) * VEC; c < cols; c += step) {
      float v[VEC], w[VEC], d[VEC];
      load_vec<T, VEC>(xr + c, v);
      load_vec<T, VEC>(scale + c, w);
      load_vec<T, VEC>(dyr + c, d);
#pragma unroll
      for (int i = 0; i < VEC; ++i) {
        const float g = d[i] * w[i];
        sum_g += g;
        sum_gx += g * (v[i] - mu) * r;
      }
    }
    const float mean_gx = group_sum<THREADS>(sum_gx, red) * inv_cols;
    const float mean_g = RMS ? 0.f : group_sum<THREADS>(sum_g, red) * inv_cols;
    T* dxr = dx + row * cols;
    for (int64_t c = static_cast<int64_t>(tid) * VEC; c < cols; c += step) {
      float v[VEC], w[VEC], d[VEC], o[VEC], dw[VEC];
      load_vec<T, VEC>(xr + c, v);
      load_vec<T, VEC>(scale + c, w);
      load_vec<T, VEC>(dyr + c, d);
#pragma unroll
      for (int i = 0; i < VEC; ++i) {
        const float xhat = (v[i] - mu) * r;
        o[i] = r * (d[i] * w[i] - mean_g - xhat * mean_gx);
        dw[i] = d[i] * xhat;
      }
      store_vec<T, VEC>(dxr + c, o);
#pragma unroll
      for (int j = 0; j < VEC; j += W) {
        acc_add<W>(acc_w + c + j, dw + j);
        if (!RMS) acc_add<W>(acc_b + c + j, d + j);
      }
    }
  }
  if (use_smem) {
    for (int64_t c = static_cast<int64_t>(tid) * VEC; c < cols; c += step) {
#pragma unroll
      for (int j = 0; j < VEC; j += W) {
        acc_copy<W>(out_w + c + j, acc_w + c + j);
        if (!RMS)
          acc_copy<W>(out_w + partial_rows * cols + c + j, acc_b + c + j);
      }
    }
  }
}

// out[c] = sum_r partial[r * cols + c], r < partial_rows. Block: 32 x 32.
template <typename T>
__global__ void column_sum_kernel(const float* __restrict__ partial,
                                  int64_t partial_rows, int64_t cols,
                                  T* __restrict__ out) {
  __shared__ float tile[32][33];
  const int64_t c = static_cast<int64_t>(blockIdx.x) * 32 + threadIdx.x;
  float s = 0.f;
  if (c < cols) {
    for (int64_t r = threadIdx.y; r < partial_rows; r += 32)
      s += partial[r * cols + c];
  }
  tile[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
#pragma unroll
    for (int i = 1; i < 32; ++i) s += tile[i][threadIdx.x];
    out[c] = from_float<T>(s);
  }
}

// ---------------------------------------------------------------- host side

constexpr int kWarpRowsPerBlock = 4;   // warp-per-row blocks: 4 rows x 32
constexpr int kBlockThreads = 256;     // block-per-row blocks
constexpr int64_t kWarpMaxCols = 1024;
constexpr int64_t kMinRowsPerGroup = 8;  // backward rows per partial row

inline bool aligned16(const void* p) {
  return p == nullptr || reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

// Launch geometry shared by planning (workspace size) and launching.
struct Plan {
  int threads_per_row;  // 32 (warp per row) or kBlockThreads
  int block;            // threads per block
  int grid;             // blocks
  int64_t partial_rows; // backward: rows of each partial plane
  size_t smem;          // backward: dynamic shared memory bytes (0: partials
                        // accumulate in global memory)
};

inline Plan make_plan(int64_t rows, int64_t cols) {
  Plan p;
  p.threads_per_row = cols <= kWarpMaxCols ? 32 : kBlockThreads;
  p.block = p.threads_per_row == 32 ? 32 * kWarpRowsPerBlock : kBlockThreads;
  const int rows_per_block = p.block / p.threads_per_row;
  const int64_t need = (rows + rows_per_block - 1) / rows_per_block;
  p.grid = static_cast<int>(need < 1 ? 1 : (need > 65535 ? 65535 : need));
  p.partial_rows = static_cast<int64_t>(p.grid) * rows_per_block;
  p.smem = 0;
  return p;
}

template <typename T, int VEC, bool RMS>
const void* bwd_kernel(const Plan& p) {
  if (p.threads_per_row == 32)
    return reinterpret_cast<const void*>(norm_bwd_kernel<T, VEC, 32, RMS>);
  return reinterpret_cast<const void*>(
      norm_bwd_kernel<T, VEC, kBlockThreads, RMS>);
}

// The smaller value of the vector and the scalar backward kernel for p of:
// occupancy false, the dynamic shared memory a launch gets without opt-in
// (48 KiB less the kernel's static shared memory); occupancy true, how many
// blocks of p.block threads and p.smem bytes fit on one SM.
template <typename T, bool RMS>
cudaError_t bwd_kernel_limits(const Plan& p, bool occupancy, int* out) {
  constexpr int V = 16 / sizeof(T);
  const void* kernels[2] = {bwd_kernel<T, V, RMS>(p), bwd_kernel<T, 1, RMS>(p)};
  int least = 0;
  for (int i = 0; i < 2; ++i) {
    int value = 0;
    cudaError_t err;
    if (occupancy) {
      err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&value, kernels[i],
                                                          p.block, p.smem);
    } else {
      cudaFuncAttributes attr;
      err = cudaFuncGetAttributes(&attr, kernels[i]);
      value = attr.maxDynamicSharedSizeBytes;
    }
    if (err != cudaSuccess) return err;
    least = i == 0 || value < least ? value : least;
  }
  *out = least;
  return cudaSuccess;
}

// Backward plan for element type T. Partials accumulate in shared memory when
// the kernel accepts that much without opt-in. The grid is capped at the
// blocks the device keeps resident at once (the fewer of the vector and
// scalar kernels'), so no block waits for a second wave, and each group owns
// many rows so the partial workspace stays small.
template <typename T>
cudaError_t make_bwd_plan(int64_t rows, int64_t cols, bool rms, Plan* out) {
  Plan p = make_plan(rows, cols);
  int dev = 0, sms = 0, smem_limit = 0, per_sm = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess) return err;
  err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  if (err != cudaSuccess) return err;
  const int rows_per_block = p.block / p.threads_per_row;
  const size_t smem = static_cast<size_t>(rows_per_block) * (rms ? 1 : 2) *
                      static_cast<size_t>(cols) * sizeof(float);
  p.smem = 0;
  err = rms ? bwd_kernel_limits<T, true>(p, false, &smem_limit)
            : bwd_kernel_limits<T, false>(p, false, &smem_limit);
  if (err != cudaSuccess) return err;
  if (smem <= static_cast<size_t>(smem_limit)) p.smem = smem;
  err = rms ? bwd_kernel_limits<T, true>(p, true, &per_sm)
            : bwd_kernel_limits<T, false>(p, true, &per_sm);
  if (err != cudaSuccess) return err;
  if (per_sm < 1) per_sm = 1;
  // Each group handles >= kMinRowsPerGroup rows so the partials (written and
  // re-read once per group) stay a small fraction of the row traffic.
  int64_t cap = static_cast<int64_t>(sms) * per_sm;
  const int64_t by_rows =
      (rows + rows_per_block * kMinRowsPerGroup - 1) /
      (rows_per_block * kMinRowsPerGroup);
  if (by_rows < cap) cap = by_rows < 1 ? 1 : by_rows;
  if (p.grid > cap) p.grid = static_cast<int>(cap);
  p.partial_rows = static_cast<int64_t>(p.grid) * rows_per_block;
  *out = p;
  return cudaSuccess;
}

// Elements of a row each thread holds in registers in norm_fwd_cached_kernel:
// rows up to 32 * threads_per_row elements (1024 warp per row, 8192 block per
// row) take the cached kernel when vectorized.
constexpr int kCachedElems = 32;

template <typename T, int VEC, int THREADS, bool RMS>
void launch_fwd(const Plan& p, const T* x, const T* scale, const T* bias, T* y,
                float* mean, float* invvar, int64_t rows, int64_t cols,
                float eps, cudaStream_t stream) {
  if constexpr (VEC > 1) {
    constexpr int CHUNKS = kCachedElems / VEC;
    if (cols <= static_cast<int64_t>(CHUNKS) * THREADS * VEC) {
      norm_fwd_cached_kernel<T, VEC, THREADS, CHUNKS, RMS>
          <<<p.grid, p.block, 0, stream>>>(x, scale, bias, y, mean, invvar,
                                           rows, cols, eps);
      return;
    }
  }
  norm_fwd_kernel<T, VEC, THREADS, RMS><<<p.grid, p.block, 0, stream>>>(
      x, scale, bias, y, mean, invvar, rows, cols, eps);
}

template <typename T, int VEC, bool RMS>
void launch_fwd_threads(const Plan& p, const T* x, const T* scale,
                        const T* bias, T* y, float* mean, float* invvar,
                        int64_t rows, int64_t cols, float eps,
                        cudaStream_t stream) {
  if (p.threads_per_row == 32)
    launch_fwd<T, VEC, 32, RMS>(p, x, scale, bias, y, mean, invvar, rows, cols,
                                eps, stream);
  else
    launch_fwd<T, VEC, kBlockThreads, RMS>(p, x, scale, bias, y, mean, invvar,
                                           rows, cols, eps, stream);
}

// Forward entry point. bias/mean may be null when rms is true.
template <typename T>
cudaError_t norm_forward(const T* x, const T* scale, const T* bias, T* y,
                         float* mean, float* invvar, int64_t rows, int64_t cols,
                         float eps, bool rms, cudaStream_t stream) {
  if (rows == 0 || cols == 0) return cudaSuccess;
  constexpr int V = 16 / sizeof(T);
  const Plan p = make_plan(rows, cols);
  const bool vec = cols % V == 0 && aligned16(x) && aligned16(scale) &&
                   aligned16(bias) && aligned16(y);
  if (rms) {
    if (vec)
      launch_fwd_threads<T, V, true>(p, x, scale, bias, y, mean, invvar, rows,
                                     cols, eps, stream);
    else
      launch_fwd_threads<T, 1, true>(p, x, scale, bias, y, mean, invvar, rows,
                                     cols, eps, stream);
  } else {
    if (vec)
      launch_fwd_threads<T, V, false>(p, x, scale, bias, y, mean, invvar, rows,
                                      cols, eps, stream);
    else
      launch_fwd_threads<T, 1, false>(p, x, scale, bias, y, mean, invvar, rows,
                                      cols, eps, stream);
  }
  return cudaGetLastError();
}

template <typename T, int VEC, bool RMS>
void launch_bwd_threads(const Plan& p, const T* x, const T* scale,
                        const float* mean, const float* invvar, const T* dy,
                        T* dx, float* partial, int64_t rows, int64_t cols,
                        cudaStream_t stream) {
  const bool use_smem = p.smem > 0;
  if (p.threads_per_row == 32)
    norm_bwd_kernel<T, VEC, 32, RMS><<<p.grid, p.block, p.smem, stream>>>(
        x, scale, mean, invvar, dy, dx, partial, rows, cols, p.partial_rows,
        use_smem);
  else
    norm_bwd_kernel<T, VEC, kBlockThreads, RMS>
        <<<p.grid, p.block, p.smem, stream>>>(x, scale, mean, invvar, dy, dx,
                                              partial, rows, cols,
                                              p.partial_rows, use_smem);
}

// Float32 workspace elements norm_backward<T> needs for this shape.
template <typename T>
cudaError_t backward_workspace_elems(int64_t rows, int64_t cols, bool rms,
                                     int64_t* elems) {
  Plan p;
  const cudaError_t err = make_bwd_plan<T>(rows, cols, rms, &p);
  *elems = err == cudaSuccess ? p.partial_rows * cols * (rms ? 1 : 2) : 0;
  return err;
}

// Backward entry point. workspace: backward_workspace_elems<T>() floats.
// dbias/mean may be null when rms is true.
template <typename T>
cudaError_t norm_backward(const T* x, const T* scale, const float* mean,
                          const float* invvar, const T* dy, T* dx, T* dscale,
                          T* dbias, float* workspace, int64_t rows,
                          int64_t cols, bool rms, cudaStream_t stream) {
  if (cols == 0) return cudaSuccess;
  Plan p;
  cudaError_t err = make_bwd_plan<T>(rows, cols, rms, &p);
  if (err != cudaSuccess) return err;
  constexpr int V = 16 / sizeof(T);
  const bool vec = cols % V == 0 && aligned16(x) && aligned16(scale) &&
                   aligned16(dy) && aligned16(dx) && aligned16(workspace);
  if (rms) {
    if (vec)
      launch_bwd_threads<T, V, true>(p, x, scale, mean, invvar, dy, dx,
                                     workspace, rows, cols, stream);
    else
      launch_bwd_threads<T, 1, true>(p, x, scale, mean, invvar, dy, dx,
                                     workspace, rows, cols, stream);
  } else {
    if (vec)
      launch_bwd_threads<T, V, false>(p, x, scale, mean, invvar, dy, dx,
                                      workspace, rows, cols, stream);
    else
      launch_bwd_threads<T, 1, false>(p, x, scale, mean, invvar, dy, dx,
                                      workspace, rows, cols, stream);
  }
  const dim3 block(32, 32);
  const dim3 grid(static_cast<unsigned>((cols + 31) / 32));
  column_sum_kernel<T><<<grid, block, 0, stream>>>(workspace, p.partial_rows,
                                                   cols, dscale);
  if (!rms)
    column_sum_kernel<T><<<grid, block, 0, stream>>>(
        workspace + p.partial_rows * cols, p.partial_rows, cols, dbias);
  return cudaGetLastError();
}

}  // namespace fused_norm
