// Fused RMSNorm / LayerNorm CUDA kernels. Paddle-free: this header only needs
// the CUDA runtime, so both the Paddle op (fused_ln_cuda.cu) and the standalone
// C-ABI harness (harness/fused_norm_capi.cu) include it.
//
// Layout: x, y, dy, dx are row-major [rows, cols]; scale, bias are [cols];
// mean, invvar are float32 [rows]. Element types: float, __half, __nv_bfloat16.
// All arithmetic and reductions run in float32.
//
// Work split: a "group" of THREADS threads owns one row at a time (a warp, or
// a block of 64 to 512 threads), loads VEC elements per access (16-byte
// vectors when every pointer is 16-byte aligned and cols % VEC == 0, scalar
// otherwise, so any cols is correct), and strides over rows.
//
// Vectorized rows of up to 16384 (forward) and 8192 (backward) elements keep
// each thread's part of the row in registers: x (with scale and bias) is read
// once, all of a row's loads are in flight together, and the backward loads
// its next row before reducing the current one (norm_fwd_cached_kernel,
// norm_bwd_reg_kernel). Other rows read x once per pass (norm_fwd_kernel,
// norm_bwd_kernel).
//
// Backward writes per-group column partials of dscale (and dbias) into a
// float32 workspace [partial_rows, cols] (LayerNorm: two such planes), then a
// column-sum kernel reduces them into dscale/dbias in a fixed order (bitwise
// reproducible). Each column of a partial row is touched by exactly one
// thread, so no atomics are needed. The register backward accumulates them in
// registers on a persistent grid; norm_bwd_kernel in shared memory when they
// fit in 48 KiB (less its static shared memory), otherwise in the workspace.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace fused_norm {

constexpr int kWarpRowsPerBlock = 4;  // warp-per-row blocks: 4 rows x 32

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

// A 16-byte (or smaller) vector of VEC elements as loaded (one load
// instruction), and its floats.
template <typename T, int VEC>
using RawVec = typename Word<sizeof(T) * VEC>::type;

template <typename T, int VEC>
__device__ __forceinline__ void unpack_vec(const RawVec<T, VEC>& w,
                                           float (&out)[VEC]) {
  Pack<T, VEC> pk;
  memcpy(&pk, &w, sizeof(w));
#pragma unroll
  for (int i = 0; i < VEC; ++i) out[i] = to_float<T>(pk.v[i]);
}

template <typename T, int VEC>
__device__ __forceinline__ RawVec<T, VEC> load_raw(const T* p) {
  return *reinterpret_cast<const RawVec<T, VEC>*>(p);
}

template <typename T, int VEC>
__device__ __forceinline__ void load_vec(const T* p, float (&out)[VEC]) {
  unpack_vec<T, VEC>(load_raw<T, VEC>(p), out);
}

template <typename T, int VEC>
__device__ __forceinline__ void store_vec(T* p, const float (&in)[VEC]) {
  using W = RawVec<T, VEC>;
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

// Threads per block for THREADS threads per row: a warp per row runs
// kWarpRowsPerBlock rows per block; otherwise the block is the row's group.
constexpr int block_threads_of(int threads) {
  return threads == 32 ? 32 * kWarpRowsPerBlock : threads;
}
template <int THREADS>
constexpr int block_threads() {
  return block_threads_of(THREADS);
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
__global__ void __launch_bounds__(block_threads<THREADS>())
    norm_fwd_cached_kernel(const T* __restrict__ x,
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
    // scale and bias are loaded with x, before the reductions, so their
    // latency is not added to the row's (on an H100: 4096 bf16 columns
    // 75.7 -> 78.3 % of HBM peak).
    RawVec<T, VEC> ws[CHUNKS], bs[CHUNKS];
#pragma unroll
    for (int k = 0; k < CHUNKS; ++k) {
      const int64_t c = static_cast<int64_t>(tid + k * THREADS) * VEC;
      if (c < cols) {
        load_vec<T, VEC>(xr + c, v[k]);
        ws[k] = load_raw<T, VEC>(scale + c);
        if (!RMS) bs[k] = load_raw<T, VEC>(bias + c);
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
        unpack_vec<T, VEC>(ws[k], w);
        if (!RMS) unpack_vec<T, VEC>(bs[k], b);
#pragma unroll
        for (int i = 0; i < VEC; ++i)
          o[i] = (v[k][i] - mu) * r * w[i] + (RMS ? 0.f : b[i]);
        store_vec<T, VEC>(yr + c, o);
      }
    }
  }
}

// The backward's arithmetic on one vector of a row (see norm_bwd_kernel):
// bwd_sums adds g and g * xhat to the row sums; bwd_dx gives dx and
// dy * xhat, the vector's dscale term.
template <int VEC>
__device__ __forceinline__ void bwd_sums(const float (&v)[VEC],
                                         const float (&d)[VEC],
                                         const float (&w)[VEC], float mu,
                                         float r, float& sum_g,
                                         float& sum_gx) {
#pragma unroll
  for (int i = 0; i < VEC; ++i) {
    const float g = d[i] * w[i];
    sum_g += g;
    sum_gx += g * (v[i] - mu) * r;
  }
}

template <int VEC>
__device__ __forceinline__ void bwd_dx(const float (&v)[VEC],
                                       const float (&d)[VEC],
                                       const float (&w)[VEC], float mu, float r,
                                       float mean_g, float mean_gx,
                                       float (&dx)[VEC], float (&dw)[VEC]) {
#pragma unroll
  for (int i = 0; i < VEC; ++i) {
    const float xhat = (v[i] - mu) * r;
    dx[i] = r * (d[i] * w[i] - mean_g - xhat * mean_gx);
    dw[i] = d[i] * xhat;
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
      bwd_sums<VEC>(v, d, w, mu, r, sum_g, sum_gx);
    }
    const float mean_gx = group_sum<THREADS>(sum_gx, red) * inv_cols;
    const float mean_g = RMS ? 0.f : group_sum<THREADS>(sum_g, red) * inv_cols;
    T* dxr = dx + row * cols;
    for (int64_t c = static_cast<int64_t>(tid) * VEC; c < cols; c += step) {
      float v[VEC], w[VEC], d[VEC], o[VEC], dw[VEC];
      load_vec<T, VEC>(xr + c, v);
      load_vec<T, VEC>(scale + c, w);
      load_vec<T, VEC>(dyr + c, d);
      bwd_dx<VEC>(v, d, w, mu, r, mean_g, mean_gx, o, dw);
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
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // Launched with PDL (launch_column_sum): wait until the kernel before it
  // has finished and its partials are visible; a no-op otherwise.
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
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

// ------------------------------------------------- register-resident backward
// For rows of at most THREADS * VEC * CHUNKS elements with 16-byte vectors.
// THREADS == 32: a warp per row, kWarpRowsPerBlock rows per block; otherwise
// the block is the group.

// Raw vectors of row `row` owned by thread `tid` (left as they are past the
// row's end or past the last row).
template <typename T, int VEC, int THREADS, int CHUNKS>
__device__ __forceinline__ void load_row(const T* __restrict__ base,
                                         int64_t row, int64_t rows,
                                         int64_t cols, int tid,
                                         RawVec<T, VEC> (&raw)[CHUNKS]) {
  if (row >= rows) return;
  const T* r = base + row * cols;
#pragma unroll
  for (int k = 0; k < CHUNKS; ++k) {
    const int64_t c = static_cast<int64_t>(tid + k * THREADS) * VEC;
    if (c < cols) raw[k] = load_raw<T, VEC>(r + c);
  }
}


// Backward with x and dy in registers (read once, next row prefetched) and
// the dscale (dbias) column partials accumulated in registers over all the
// group's rows, then written as partial row blockIdx.x * groups + group for
// column_sum_kernel to add up. The grid is at most the blocks the device keeps
// resident at once (a persistent grid, striding over rows), so the partial
// rows are few.
template <typename T, int VEC, int THREADS, int CHUNKS, bool RMS>
__global__ void __launch_bounds__(block_threads<THREADS>())
    norm_bwd_reg_kernel(const T* __restrict__ x, const T* __restrict__ scale,
                        const float* __restrict__ mean_in,
                        const float* __restrict__ invvar_in,
                        const T* __restrict__ dy, T* __restrict__ dx,
                        float* __restrict__ partial, int64_t rows,
                        int64_t cols, int64_t partial_rows) {
  __shared__ float red[32];
  const int groups = blockDim.x / THREADS;
  const int gi = threadIdx.x / THREADS;
  const int tid = threadIdx.x % THREADS;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * groups;
  const float inv_cols = 1.f / static_cast<float>(cols);
  float acc_w[CHUNKS][VEC], acc_b[CHUNKS][VEC];
#pragma unroll
  for (int k = 0; k < CHUNKS; ++k) {
#pragma unroll
    for (int i = 0; i < VEC; ++i) acc_w[k][i] = acc_b[k][i] = 0.f;
  }
  // RMSNorm keeps its scale in registers for all its rows (LayerNorm, with
  // twice the accumulators, would spill at 512 threads) and reads it once.
  constexpr bool kScaleInRegs = RMS;
  RawVec<T, VEC> wreg[CHUNKS];
#pragma unroll
  for (int k = 0; k < CHUNKS; ++k) {
    const int64_t c = static_cast<int64_t>(tid + k * THREADS) * VEC;
    if (kScaleInRegs && c < cols)
      wreg[k] = load_raw<T, VEC>(scale + c);
  }
  int64_t row = static_cast<int64_t>(blockIdx.x) * groups + gi;
  RawVec<T, VEC> rx[CHUNKS], rd[CHUNKS], nx[CHUNKS], nd[CHUNKS];
  load_row<T, VEC, THREADS, CHUNKS>(x, row, rows, cols, tid, nx);
  load_row<T, VEC, THREADS, CHUNKS>(dy, row, rows, cols, tid, nd);
  float r_next = row < rows ? invvar_in[row] : 0.f;
  float mu_next = !RMS && row < rows ? mean_in[row] : 0.f;
  for (; row < rows; row += stride) {
#pragma unroll
    for (int k = 0; k < CHUNKS; ++k) {
      rx[k] = nx[k];
      rd[k] = nd[k];
    }
    const float r = r_next, mu = mu_next;
    const int64_t next = row + stride;
    load_row<T, VEC, THREADS, CHUNKS>(x, next, rows, cols, tid, nx);
    load_row<T, VEC, THREADS, CHUNKS>(dy, next, rows, cols, tid, nd);
    if (next < rows) {
      r_next = invvar_in[next];
      if (!RMS) mu_next = mean_in[next];
    }
    float sum_g = 0.f, sum_gx = 0.f;
#pragma unroll
    for (int k = 0; k < CHUNKS; ++k) {
      const int64_t c = static_cast<int64_t>(tid + k * THREADS) * VEC;
      if (c < cols) {
        float v[VEC], d[VEC], w[VEC];
        unpack_vec<T, VEC>(rx[k], v);
        unpack_vec<T, VEC>(rd[k], d);
        if (kScaleInRegs)
          unpack_vec<T, VEC>(wreg[k], w);
        else
          load_vec<T, VEC>(scale + c, w);
        bwd_sums<VEC>(v, d, w, mu, r, sum_g, sum_gx);
      }
    }
    const float mean_gx = group_sum<THREADS>(sum_gx, red) * inv_cols;
    const float mean_g = RMS ? 0.f : group_sum<THREADS>(sum_g, red) * inv_cols;
    T* dxr = dx + row * cols;
#pragma unroll
    for (int k = 0; k < CHUNKS; ++k) {
      const int64_t c = static_cast<int64_t>(tid + k * THREADS) * VEC;
      if (c < cols) {
        float v[VEC], d[VEC], w[VEC], o[VEC], dw[VEC];
        unpack_vec<T, VEC>(rx[k], v);
        unpack_vec<T, VEC>(rd[k], d);
        if (kScaleInRegs)
          unpack_vec<T, VEC>(wreg[k], w);
        else
          load_vec<T, VEC>(scale + c, w);
        bwd_dx<VEC>(v, d, w, mu, r, mean_g, mean_gx, o, dw);
#pragma unroll
        for (int i = 0; i < VEC; ++i) {
          acc_w[k][i] += dw[i];
          if (!RMS) acc_b[k][i] += d[i];
        }
        store_vec<T, VEC>(dxr + c, o);
      }
    }
  }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // Rows done: column_sum_kernel (launched with PDL) may start launching.
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
  const int64_t prow = static_cast<int64_t>(blockIdx.x) * groups + gi;
#pragma unroll
  for (int k = 0; k < CHUNKS; ++k) {
    const int64_t c = static_cast<int64_t>(tid + k * THREADS) * VEC;
    if (c < cols) {
#pragma unroll
      for (int j = 0; j < VEC; j += 4) {
        acc_copy<4>(partial + prow * cols + c + j, acc_w[k] + j);
        if (!RMS)
          acc_copy<4>(partial + (partial_rows + prow) * cols + c + j,
                      acc_b[k] + j);
      }
    }
  }
}

// ---------------------------------------------------------------- host side

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

// Geometry of norm_fwd_cached_kernel for a row of `cols` elements in 16-byte
// vectors: threads per row (32, 64, ..., 1024) and elements each thread holds
// (16 or 32). At most 32 elements per thread, and at least 256 threads while
// each thread still holds 16: on an H100 (benchmarks/rms_norm_cuda.py) 256
// threads per row ran bf16 rows of 4096 faster than 128 threads and rows of
// 8192 faster than 512. threads 0: the row is longer than kFwdMaxThreads * 32.
// At most 512 threads: a 1024-thread block caps a thread at 64 registers, too
// few for 32 elements of x, scale and bias.
constexpr int kFwdMaxThreads = 512;

struct FwdShape {
  int threads;
  int elems;
};

inline FwdShape fwd_shape(int64_t cols) {
  const auto pow2_from_32 = [](int64_t n) {
    int64_t t = 32;
    while (t < n) t *= 2;
    return t;
  };
  const int64_t wide = pow2_from_32((cols + 31) / 32);
  const int64_t floor = wide > 256 ? wide : 256;
  int64_t t = pow2_from_32((cols + 15) / 16);
  if (t > floor) t = floor;
  if (t > kFwdMaxThreads) return {0, 0};
  return {static_cast<int>(t), cols <= t * 16 ? 16 : 32};
}

template <int N>
using IntC = std::integral_constant<int, N>;

// f(IntC<threads>()) for threads in MIN, 2 * MIN, ..., MAX (powers of two
// from 32 to 1024); cudaErrorInvalidValue for others.
template <int MIN, int MAX, typename F>
cudaError_t with_threads(int threads, F&& f) {
  switch (threads) {
    case 32: if constexpr (MIN <= 32) return f(IntC<32>()); break;
    case 64: if constexpr (MIN <= 64 && MAX >= 64) return f(IntC<64>()); break;
    case 128: if constexpr (MIN <= 128 && MAX >= 128) return f(IntC<128>()); break;
    case 256: if constexpr (MIN <= 256 && MAX >= 256) return f(IntC<256>()); break;
    case 512: if constexpr (MAX >= 512) return f(IntC<512>()); break;
    case 1024: if constexpr (MAX >= 1024) return f(IntC<1024>()); break;
  }
  return cudaErrorInvalidValue;
}

template <typename T, int THREADS, int ELEMS, bool RMS>
cudaError_t launch_fwd_cached(const T* x, const T* scale, const T* bias, T* y,
                              float* mean, float* invvar, int64_t rows,
                              int64_t cols, float eps, cudaStream_t stream) {
  constexpr int V = 16 / sizeof(T);
  constexpr int block = block_threads<THREADS>();
  const int64_t need = (rows + block / THREADS - 1) / (block / THREADS);
  const int grid = static_cast<int>(need < 65535 ? need : 65535);
  norm_fwd_cached_kernel<T, V, THREADS, ELEMS / V, RMS>
      <<<grid, block, 0, stream>>>(x, scale, bias, y, mean, invvar, rows, cols,
                                   eps);
  return cudaGetLastError();
}

template <typename T, bool RMS>
cudaError_t launch_fwd_cached(FwdShape shape, const T* x, const T* scale,
                              const T* bias, T* y, float* mean, float* invvar,
                              int64_t rows, int64_t cols, float eps,
                              cudaStream_t stream) {
  return with_threads<32, kFwdMaxThreads>(shape.threads, [&](auto threads) {
    constexpr int t = decltype(threads)::value;
    if constexpr (t >= 256) {  // fwd_shape gives 32 elements only from 256
      if (shape.elems == 32)
        return launch_fwd_cached<T, t, 32, RMS>(x, scale, bias, y, mean, invvar,
                                                rows, cols, eps, stream);
    }
    return launch_fwd_cached<T, t, 16, RMS>(x, scale, bias, y, mean, invvar,
                                            rows, cols, eps, stream);
  });
}

// norm_fwd_kernel: a warp per row up to kWarpMaxCols, else a block per row.
template <typename T, int VEC, bool RMS>
void launch_fwd_generic(const Plan& p, const T* x, const T* scale,
                        const T* bias, T* y, float* mean, float* invvar,
                        int64_t rows, int64_t cols, float eps,
                        cudaStream_t stream) {
  if (p.threads_per_row == 32)
    norm_fwd_kernel<T, VEC, 32, RMS><<<p.grid, p.block, 0, stream>>>(
        x, scale, bias, y, mean, invvar, rows, cols, eps);
  else
    norm_fwd_kernel<T, VEC, kBlockThreads, RMS><<<p.grid, p.block, 0, stream>>>(
        x, scale, bias, y, mean, invvar, rows, cols, eps);
}

// Backward register path (norm_bwd_reg_kernel): 16 elements per thread,
// 64 to 512 threads per row, so rows of 513 to 8192 elements. At most 512:
// 1024-thread blocks cap a thread at 64 registers, and the kernel needs 80 to
// 100 without spilling. Shorter rows keep norm_bwd_kernel's warp per row.
constexpr int kBwdElems = 16;
constexpr int kBwdMinThreads = 64;
constexpr int kBwdMaxThreads = 512;

// Threads per row of norm_bwd_reg_kernel: the fewest of 64, 128, ..., 512
// whose kBwdElems elements each cover the row; 0 when the row is shorter
// than 33 * kBwdElems or longer than kBwdMaxThreads * kBwdElems.
inline int bwd_reg_threads(int64_t cols) {
  if (cols <= 32 * kBwdElems) return 0;
  for (int t = kBwdMinThreads; t <= kBwdMaxThreads; t *= 2)
    if (cols <= static_cast<int64_t>(t) * kBwdElems) return t;
  return 0;
}

template <typename T, int THREADS, bool RMS>
const void* bwd_reg_kernel() {
  constexpr int V = 16 / sizeof(T);
  return reinterpret_cast<const void*>(
      norm_bwd_reg_kernel<T, V, THREADS, kBwdElems / V, RMS>);
}

// Grid and partial rows of norm_bwd_reg_kernel: the blocks the device keeps
// resident at once, or fewer when the rows run out.
template <typename T, int THREADS, bool RMS>
cudaError_t bwd_reg_grid(int64_t rows, int* grid, int64_t* partial_rows) {
  constexpr int block = block_threads<THREADS>();
  constexpr int groups = block / THREADS;
  int dev = 0, sms = 0, per_sm = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err == cudaSuccess)
    err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  if (err == cudaSuccess)
    err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(
        &per_sm, bwd_reg_kernel<T, THREADS, RMS>(), block, 0);
  if (err != cudaSuccess) return err;
  const int64_t resident = static_cast<int64_t>(sms) * (per_sm < 1 ? 1 : per_sm);
  const int64_t need = rows < 1 ? 1 : (rows + groups - 1) / groups;
  *grid = static_cast<int>(need < resident ? need : resident);
  *partial_rows = static_cast<int64_t>(*grid) * groups;
  return cudaSuccess;
}

// column_sum_kernel into out. PDL: on Hopper and later the launch may begin
// while the kernel before it (which triggers its dependents once its rows are
// done) writes its partials; column_sum_kernel waits for them first.
template <typename T>
cudaError_t launch_column_sum(const float* partial, int64_t partial_rows,
                              int64_t cols, T* out, bool pdl,
                              cudaStream_t stream) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(static_cast<unsigned>((cols + 31) / 32));
  cfg.blockDim = dim3(32, 32);
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl ? 1 : 0;
  return cudaLaunchKernelEx(&cfg, column_sum_kernel<T>, partial, partial_rows,
                            cols, out);
}

template <typename T, int THREADS, bool RMS>
cudaError_t launch_bwd_reg(const T* x, const T* scale, const float* mean,
                           const float* invvar, const T* dy, T* dx, T* dscale,
                           T* dbias, float* partial, int64_t rows,
                           int64_t cols, cudaStream_t stream) {
  int grid = 0, dev = 0, major = 0;
  int64_t partial_rows = 0;
  cudaError_t err = bwd_reg_grid<T, THREADS, RMS>(rows, &grid, &partial_rows);
  if (err == cudaSuccess) err = cudaGetDevice(&dev);
  if (err == cudaSuccess)
    err = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  if (err != cudaSuccess) return err;
  const bool pdl = major >= 9;
  constexpr int V = 16 / sizeof(T);
  norm_bwd_reg_kernel<T, V, THREADS, kBwdElems / V, RMS>
      <<<grid, block_threads<THREADS>(), 0, stream>>>(
          x, scale, mean, invvar, dy, dx, partial, rows, cols, partial_rows);
  err = cudaGetLastError();
  if (err == cudaSuccess)
    err = launch_column_sum<T>(partial, partial_rows, cols, dscale, pdl, stream);
  if (err == cudaSuccess && !RMS)
    err = launch_column_sum<T>(partial + partial_rows * cols, partial_rows,
                               cols, dbias, false, stream);
  return err;
}

// Forward entry point. bias/mean may be null when rms is true.
template <typename T>
cudaError_t norm_forward(const T* x, const T* scale, const T* bias, T* y,
                         float* mean, float* invvar, int64_t rows, int64_t cols,
                         float eps, bool rms, cudaStream_t stream) {
  if (rows == 0 || cols == 0) return cudaSuccess;
  constexpr int V = 16 / sizeof(T);
  const bool vec = cols % V == 0 && aligned16(x) && aligned16(scale) &&
                   aligned16(bias) && aligned16(y);
  const FwdShape shape = vec ? fwd_shape(cols) : FwdShape{0, 0};
  if (shape.threads > 0)
    return rms ? launch_fwd_cached<T, true>(shape, x, scale, bias, y, mean,
                                            invvar, rows, cols, eps, stream)
               : launch_fwd_cached<T, false>(shape, x, scale, bias, y, mean,
                                             invvar, rows, cols, eps, stream);
  const Plan p = make_plan(rows, cols);
  if (rms) {
    if (vec)
      launch_fwd_generic<T, V, true>(p, x, scale, bias, y, mean, invvar, rows,
                                     cols, eps, stream);
    else
      launch_fwd_generic<T, 1, true>(p, x, scale, bias, y, mean, invvar, rows,
                                     cols, eps, stream);
  } else {
    if (vec)
      launch_fwd_generic<T, V, false>(p, x, scale, bias, y, mean, invvar, rows,
                                      cols, eps, stream);
    else
      launch_fwd_generic<T, 1, false>(p, x, scale, bias, y, mean, invvar, rows,
                                      cols, eps, stream);
  }
  return cudaGetLastError();
}

// norm_bwd_kernel for rows the register path does not take.
template <typename T, int VEC, bool RMS>
void launch_bwd_generic(const Plan& p, const T* x, const T* scale,
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

// Float32 workspace elements norm_backward<T> needs for this shape: the more
// of the register path's and the generic path's, as pointer alignment (known
// only at the call) picks between them.
template <typename T>
cudaError_t backward_workspace_elems(int64_t rows, int64_t cols, bool rms,
                                     int64_t* elems) {
  constexpr int V = 16 / sizeof(T);
  Plan p;
  cudaError_t err = make_bwd_plan<T>(rows, cols, rms, &p);
  *elems = err == cudaSuccess ? p.partial_rows * cols * (rms ? 1 : 2) : 0;
  const int reg = cols % V == 0 ? bwd_reg_threads(cols) : 0;
  if (reg > 0 && err == cudaSuccess) {
    int grid = 0;
    int64_t partial_rows = 0;
    err = with_threads<kBwdMinThreads, kBwdMaxThreads>(reg, [&](auto threads) {
      constexpr int t = decltype(threads)::value;
      return rms ? bwd_reg_grid<T, t, true>(rows, &grid, &partial_rows)
                 : bwd_reg_grid<T, t, false>(rows, &grid, &partial_rows);
    });
    const int64_t reg_elems = partial_rows * cols * (rms ? 1 : 2);
    if (reg_elems > *elems) *elems = reg_elems;
  }
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
  constexpr int V = 16 / sizeof(T);
  const bool vec = cols % V == 0 && aligned16(x) && aligned16(scale) &&
                   aligned16(dy) && aligned16(dx) && aligned16(workspace);
  const int reg = vec ? bwd_reg_threads(cols) : 0;
  if (reg > 0)
    return with_threads<kBwdMinThreads, kBwdMaxThreads>(reg, [&](auto threads) {
      constexpr int t = decltype(threads)::value;
      return rms ? launch_bwd_reg<T, t, true>(x, scale, mean, invvar, dy, dx,
                                              dscale, dbias, workspace, rows,
                                              cols, stream)
                 : launch_bwd_reg<T, t, false>(x, scale, mean, invvar, dy, dx,
                                               dscale, dbias, workspace, rows,
                                               cols, stream);
    });
  Plan p;
  cudaError_t err = make_bwd_plan<T>(rows, cols, rms, &p);
  if (err != cudaSuccess) return err;
  if (rms) {
    if (vec)
      launch_bwd_generic<T, V, true>(p, x, scale, mean, invvar, dy, dx,
                                     workspace, rows, cols, stream);
    else
      launch_bwd_generic<T, 1, true>(p, x, scale, mean, invvar, dy, dx,
                                     workspace, rows, cols, stream);
  } else {
    if (vec)
      launch_bwd_generic<T, V, false>(p, x, scale, mean, invvar, dy, dx,
                                      workspace, rows, cols, stream);
    else
      launch_bwd_generic<T, 1, false>(p, x, scale, mean, invvar, dy, dx,
                                      workspace, rows, cols, stream);
  }
  err = cudaGetLastError();
  if (err == cudaSuccess)
    err = launch_column_sum<T>(workspace, p.partial_rows, cols, dscale, false,
                               stream);
  if (err == cudaSuccess && !rms)
    err = launch_column_sum<T>(workspace + p.partial_rows * cols,
                               p.partial_rows, cols, dbias, false, stream);
  return err;
}

}  // namespace fused_norm
