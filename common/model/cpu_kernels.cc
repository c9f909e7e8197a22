#include "common/model/cpu_kernels.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#include "common/model/cpu_runtime.h"
#include "common/model/paged_attention_layout.h"
#include "common/util/work_sharing_pool.h"

// The inner loops are written so that GCC vectorises them (independent lanes, no reductions across
// lanes); target_clones compiles them for AVX-512 and AVX2 too and picks one at load time, so the
// binary still runs on any x86-64. Not under TSan: the clones' ifunc resolvers run while the
// dynamic loader relocates, before TSan's runtime exists, and its instrumentation of them crashes.
// SPECULA_X86_KERNELS: this build compiles the clones and the kernels for instruction sets beyond
// its baseline (the AVX-512 tiles, the AVX512-BF16 matmul), each called only where the CPU has it.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_THREAD__)
#define SPECULA_X86_KERNELS 1
#include <immintrin.h>
#endif

#ifdef SPECULA_X86_KERNELS
#define SPECULA_VECTOR_CLONES \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define SPECULA_VECTOR_CLONES
#endif

namespace specula {
namespace {

// Splits [begin, end) into contiguous ranges of at least `grain` items (a few per thread, so that
// a thread that starts late or is preempted leaves its share to the others) and runs
// f(range_begin, range_end) on each, on the kernel pool (cpu_runtime) with at most `max_threads`
// threads in use. f must not throw.
template <typename F>
void ParallelRanges(int64_t begin, int64_t end, int64_t grain, int max_threads, const F& f) {
  const int64_t n = end - begin;
  if (n <= 0) return;
  constexpr int64_t kRangesPerThread = 4;
  const int64_t ranges = std::min<int64_t>(int64_t{max_threads} * kRangesPerThread,
                                           (n + grain - 1) / std::max<int64_t>(1, grain));
  std::shared_ptr<WorkSharingPool> pool = max_threads > 1 ? KernelPool() : nullptr;
  if (ranges <= 1 || !pool || pool->threads() <= 1) {
    f(begin, end);
    return;
  }
  const int64_t size = (n + ranges - 1) / ranges;
  pool->Run((n + size - 1) / size, [&](int64_t r) {
    const int64_t b = begin + r * size;
    f(b, std::min(end, b + size));
  });
}

constexpr int kLanes = 16;
constexpr int64_t kChunk = 64;        // keys scored per online-softmax update
constexpr int64_t kMaxHeads = 128;    // query heads the attention kernel handles
constexpr int64_t kMaxVectors = 128;  // query vectors (rows x heads) sharing one key read
constexpr int64_t kMaxHeadDim = 256;

// exp(x) for x <= 0 (softmax after subtracting the max; silu uses it on clamped inputs):
// Cephes' expf polynomial, relative error ~2 ulp. Branch-free and without float-to-int
// conversions (which GCC will not vectorise without -fno-trapping-math), so loops over it
// vectorise: adding 1.5 * 2^23 rounds x / ln 2 to the nearest integer n and leaves n in the low
// mantissa bits, from which 2^n is built.
__attribute__((always_inline)) inline float ExpNonPositive(float x) {
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23
  x = std::max(x, -87.0f);
  const float t = x * 1.44269504088896341f + kRound;
  const float k = t - kRound;
  const float r = x - k * 0.693359375f + k * 2.12194440e-4f;
  float y = 1.9875691500e-4f;
  y = y * r + 1.3981999507e-3f;
  y = y * r + 8.3334519073e-3f;
  y = y * r + 4.1665795894e-2f;
  y = y * r + 1.6666665459e-1f;
  y = y * r + 5.0000001201e-1f;
  y = y * r * r + r + 1.0f;
  const int32_t bits = (std::bit_cast<int32_t>(t) - std::bit_cast<int32_t>(kRound) + 127) << 23;
  return y * std::bit_cast<float>(bits);
}

__attribute__((always_inline)) inline float Dot(const float* a, const float* b, int64_t n) {
  float acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int t = 0; t < kLanes; ++t) acc[t] += a[i + t] * b[i + t];
  }
  float s = 0;
  for (int t = 0; t < kLanes; ++t) s += acc[t];
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

// Max and sum over n floats with kLanes independent accumulators, so that the loops vectorise
// without reassociation flags (float reductions are otherwise kept in order, scalar).
__attribute__((always_inline)) inline float MaxOf(const float* x, int64_t n) {
  float acc[kLanes];
  for (int t = 0; t < kLanes; ++t) acc[t] = -std::numeric_limits<float>::infinity();
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int t = 0; t < kLanes; ++t) acc[t] = acc[t] > x[i + t] ? acc[t] : x[i + t];
  }
  float m = -std::numeric_limits<float>::infinity();
  for (int t = 0; t < kLanes; ++t) m = std::max(m, acc[t]);
  for (; i < n; ++i) m = std::max(m, x[i]);
  return m;
}

__attribute__((always_inline)) inline float SumOf(const float* x, int64_t n) {
  float acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int t = 0; t < kLanes; ++t) acc[t] += x[i + t];
  }
  float s = 0;
  for (int t = 0; t < kLanes; ++t) s += acc[t];
  for (; i < n; ++i) s += x[i];
  return s;
}

SPECULA_VECTOR_CLONES
void RmsNormRows(const float* x, const float* w, float* out, int64_t rows, int64_t d, float eps) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * d;
    float* o = out + r * d;
    const float inv = 1.0f / std::sqrt(Dot(xr, xr, d) / static_cast<float>(d) + eps);
    for (int64_t i = 0; i < d; ++i) o[i] = w[i] * (xr[i] * inv);
  }
}

SPECULA_VECTOR_CLONES
void SiluMulRows(const float* gu, float* out, int64_t rows, int64_t f) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* g = gu + r * 2 * f;
    const float* u = g + f;
    float* o = out + r * f;
    for (int64_t i = 0; i < f; ++i) {
      // silu(g) = g / (1 + exp(-g)); exp of -|g| keeps the argument non-positive.
      const float e = ExpNonPositive(-std::fabs(g[i]));
      const float sig = (g[i] >= 0 ? 1.0f : e) / (1.0f + e);
      o[i] = g[i] * sig * u[i];
    }
  }
}

SPECULA_VECTOR_CLONES
void RotateRow(const float* x, const float* cos, const float* sin, float* out, int64_t heads,
               int64_t head_stride, int64_t hd) {
  const int64_t half = hd / 2;
  for (int64_t h = 0; h < heads; ++h) {
    const float* xh = x + h * head_stride;
    float* o = out + h * hd;
    for (int64_t i = 0; i < half; ++i) o[i] = xh[i] * cos[i] + (-xh[i + half]) * sin[i];
    for (int64_t i = half; i < hd; ++i) o[i] = xh[i] * cos[i] + xh[i - half] * sin[i];
  }
}

// The attention kernel works on "query vectors": the heads a task attends for (all of them, or
// those of some key/value heads) of a run of consecutive rows of one sequence, row-major: vector i
// is the task's head i % nh of row i / nh. Vectors of one run share each key and value read; a
// slot row holds all kv heads contiguously.
struct AttendArgs {
  const float* const* q;  // per query vector (row-major: a row's heads, then the next row's)
  const float* kc;
  const float* vc;
  int64_t nh;  // query heads attended per row (all of the model's, or one task's share)
  int64_t nkv, hd;
  float scale;
  float* const* out;         // per vector: where its hd outputs go
  float* m;                  // running max per vector
  float* l;                  // running sum per vector
  const int64_t* kv_offset;  // per vector: its kv head's offset inside a slot row (floats)
  // Optional keys/values of each row's own, [rows, row_keys, nkv, hd] (row r's j-th at slot
  // r * row_keys + j), of which row r sees the first row_key_count[r].
  const float* rk = nullptr;
  const float* rv = nullptr;
  int64_t row_keys = 0;
  const int32_t* row_key_count = nullptr;
  bool prefetch = false;  // ask for keys and values ahead (a cache read too large to stay cached)
};

// 16 floats as one GCC vector: a zmm register in the AVX-512 clone, two ymm in the AVX2 one, four
// xmm by default. Explicit vectors because GCC fully unrolls short fixed loops and then leaves them
// scalar.
typedef float Vec16 __attribute__((vector_size(64)));
typedef float Vec16Unaligned __attribute__((vector_size(64), aligned(4)));

__attribute__((always_inline)) inline Vec16 Load16(const float* p) {
  return *reinterpret_cast<const Vec16Unaligned*>(p);
}
__attribute__((always_inline)) inline void Store16(float* p, Vec16 v) {
  *reinterpret_cast<Vec16Unaligned*>(p) = v;
}
typedef float Vec8 __attribute__((vector_size(32)));
typedef float Vec4 __attribute__((vector_size(16)));
// Tree reduction: 3 shuffle+add levels instead of 15 dependent scalar adds.
__attribute__((always_inline)) inline float HorizontalSum(Vec16 v) {
  const Vec8 h = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7) +
                 __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
  const Vec4 q =
      __builtin_shufflevector(h, h, 0, 1, 2, 3) + __builtin_shufflevector(h, h, 4, 5, 6, 7);
  return (q[0] + q[2]) + (q[1] + q[3]);
}

// HD > 0 (a multiple of 16): head_dim known at compile time, accumulators in registers;
// HD == 0: a.hd at run time, scalar loops.
template <int HD>
__attribute__((always_inline)) inline float DotT(const float* a, const float* b, int64_t hd) {
  if constexpr (HD > 0) {
    Vec16 acc = Load16(a) * Load16(b);
    for (int i = 16; i < HD; i += 16) acc += Load16(a + i) * Load16(b + i);
    return HorizontalSum(acc);
  } else {
    return Dot(a, b, hd);
  }
}

// Folds n keys (cache slots) into the running softmax of `nv` query vectors and accumulates the
// weighted values. Always inlined into AttendRows so that it is compiled for the clone's ISA.
// Asks for the cache lines of `floats` floats from p (one cache slot: every key/value head).
__attribute__((always_inline)) inline void PrefetchFloats(const float* p, int64_t floats) {
  for (int64_t i = 0; i < floats; i += 16) __builtin_prefetch(p + i);
}

// Keys and values fetched this many slots ahead of the one being scored, once a layer's cache read
// is at least kKvPrefetchBytes.
constexpr int64_t kKeyPrefetchSlots = 8;
constexpr int64_t kKvPrefetchBytes = int64_t{4} << 20;

template <int HD>
__attribute__((always_inline)) inline void AttendChunk(const AttendArgs& a, const int64_t* slots,
                                                       int64_t n, int64_t nv) {
  const int64_t hd = HD > 0 ? HD : a.hd, slot_stride = a.nkv * hd;
  float scores[kMaxVectors][kChunk];
  // A large cache read (PagedAttentionInto decides) streams from memory in blocks the hardware
  // prefetcher finds anew: each slot's keys and values are asked for a few slots ahead.
  if (a.prefetch) {
    for (int64_t c = 0; c < std::min(n, kKeyPrefetchSlots); ++c) {
      PrefetchFloats(a.kc + slots[c] * slot_stride, slot_stride);
      PrefetchFloats(a.vc + slots[c] * slot_stride, slot_stride);
    }
  }
  for (int64_t c = 0; c < n; ++c) {
    if (a.prefetch && c + kKeyPrefetchSlots < n) {
      PrefetchFloats(a.kc + slots[c + kKeyPrefetchSlots] * slot_stride, slot_stride);
      PrefetchFloats(a.vc + slots[c + kKeyPrefetchSlots] * slot_stride, slot_stride);
    }
    const float* k = a.kc + slots[c] * slot_stride;
    for (int64_t i = 0; i < nv; ++i) {
      scores[i][c] = DotT<HD>(a.q[i], k + a.kv_offset[i], hd) * a.scale;
    }
  }
  for (int64_t i = 0; i < nv; ++i) {
    const float mx = std::max(a.m[i], MaxOf(scores[i], n));
    const float correction = ExpNonPositive(a.m[i] - mx);  // m = -inf: exp -> ~0
    for (int64_t c = 0; c < n; ++c) scores[i][c] = ExpNonPositive(scores[i][c] - mx);
    const float sum = SumOf(scores[i], n);
    a.l[i] = a.l[i] * correction + sum;
    a.m[i] = mx;
    // Accumulate this vector's values over the chunk in registers, then fold into out once.
    float* o = a.out[i];
    if constexpr (HD > 0) {
      Vec16 acc[HD / 16] = {};
      for (int64_t c = 0; c < n; ++c) {
        const float p = scores[i][c];
        const float* v = a.vc + slots[c] * slot_stride + a.kv_offset[i];
        for (int j = 0; j < HD / 16; ++j) acc[j] += p * Load16(v + 16 * j);
      }
      for (int j = 0; j < HD / 16; ++j)
        Store16(o + 16 * j, Load16(o + 16 * j) * correction + acc[j]);
      continue;
    }
    float acc[kMaxHeadDim];
    for (int64_t d = 0; d < hd; ++d) acc[d] = 0;
    for (int64_t c = 0; c < n; ++c) {
      const float p = scores[i][c];
      const float* v = a.vc + slots[c] * slot_stride + a.kv_offset[i];
      for (int64_t d = 0; d < hd; ++d) acc[d] += p * v[d];
    }
    for (int64_t d = 0; d < hd; ++d) o[d] = o[d] * correction + acc[d];
  }
}

// Feeds the positions [begin, end) of row r's sequence to AttendChunk in chunks, walking the block
// table block by block (slots are consecutive inside a block).
template <int HD>
__attribute__((always_inline)) inline void AttendSpan(const AttendArgs& a,
                                                      const PagedAttentionLayout& layout, int64_t r,
                                                      int64_t begin, int64_t end, int64_t nv) {
  const int64_t bs = layout.block_size();
  int64_t slots[kChunk];
  int64_t n = 0;
  for (int64_t pos = begin; pos < end;) {
    const int64_t block_end = std::min(end, (pos / bs + 1) * bs);
    const int64_t base = layout.Slot(r, pos);
    for (int64_t i = 0; pos < block_end; ++pos, ++i) {
      slots[n++] = base + i;
      if (n == kChunk) {
        AttendChunk<HD>(a, slots, n, nv);
        n = 0;
      }
    }
  }
  if (n > 0) AttendChunk<HD>(a, slots, n, nv);
}

// Rows [r0, r1) of one sequence: the key span all of them see is read once for all their heads,
// then each row's own remainder (later chain positions, tree ancestors) separately.
template <int HD>
__attribute__((always_inline)) inline void AttendRowsT(AttendArgs a,
                                                       const PagedAttentionLayout& layout,
                                                       int64_t r0, int64_t r1) {
  const int64_t nh = a.nh, hd = HD > 0 ? HD : a.hd, rows = r1 - r0;
  for (int64_t i = 0; i < rows * nh; ++i) {
    a.m[i] = -std::numeric_limits<float>::infinity();
    a.l[i] = 0;
  }
  for (int64_t i = 0; i < rows * nh; ++i) std::fill(a.out[i], a.out[i] + hd, 0.0f);
  int64_t shared_begin = 0, shared_end = std::numeric_limits<int64_t>::max();
  for (int64_t r = r0; r < r1; ++r) {
    shared_begin = std::max<int64_t>(shared_begin, layout.span_begin(r));
    shared_end = std::min<int64_t>(shared_end, layout.span_end(r));
  }
  shared_end = std::max(shared_end, shared_begin);
  AttendSpan<HD>(a, layout, r0, shared_begin, shared_end, rows * nh);
  for (int64_t r = r0; r < r1; ++r) {
    AttendArgs row = a;
    const int64_t offset = (r - r0) * nh;
    row.q += offset;
    row.out += offset;
    row.m += offset;
    row.l += offset;
    AttendSpan<HD>(row, layout, r, layout.span_begin(r),
                   std::min<int64_t>(shared_begin, layout.span_end(r)), nh);
    AttendSpan<HD>(row, layout, r, std::max<int64_t>(shared_end, layout.span_begin(r)),
                   layout.span_end(r), nh);
    int64_t slots[kChunk];
    int64_t n = 0;
    for (const int32_t* e = layout.extra_begin(r); e != layout.extra_end(r); ++e) {
      slots[n++] = layout.Slot(r, *e);
      if (n == kChunk) {
        AttendChunk<HD>(row, slots, n, nh);
        n = 0;
      }
    }
    if (n > 0) AttendChunk<HD>(row, slots, n, nh);
    if (a.rk != nullptr) {
      AttendArgs own = row;
      own.kc = a.rk;
      own.vc = a.rv;
      n = 0;
      for (int64_t j = 0; j < a.row_key_count[r]; ++j) {
        slots[n++] = r * a.row_keys + j;
        if (n == kChunk) {
          AttendChunk<HD>(own, slots, n, nh);
          n = 0;
        }
      }
      if (n > 0) AttendChunk<HD>(own, slots, n, nh);
    }
  }
  for (int64_t i = 0; i < rows * nh; ++i) {
    const float inv = a.l[i] > 0 ? 1.0f / a.l[i] : 0.0f;
    float* o = a.out[i];
    for (int64_t d = 0; d < hd; ++d) o[d] *= inv;
  }
}

SPECULA_VECTOR_CLONES
void AttendRows(const AttendArgs& a, const PagedAttentionLayout& layout, int64_t r0, int64_t r1) {
  switch (a.hd) {
    case 32:
      return AttendRowsT<32>(a, layout, r0, r1);
    case 64:
      return AttendRowsT<64>(a, layout, r0, r1);
    case 128:
      return AttendRowsT<128>(a, layout, r0, r1);
    default:
      return AttendRowsT<0>(a, layout, r0, r1);
  }
}

constexpr int64_t kWeightPrefetchFloats = 1024;

// y[m][n] = bias[n] + residual[m][n] + sum_k x[m][k] w[n][k] for a few rows m: each weight row is
// read once for all of them (the product is bound by reading the weights).
template <int M>
__attribute__((always_inline)) inline void SmallMatmulT(const float* x, const float* w,
                                                        const float* bias, const float* residual,
                                                        float* y, int64_t n0, int64_t n1,
                                                        int64_t n_out, int64_t k) {
  for (int64_t n = n0; n < n1; ++n) {
    const float* wr = w + n * k;
    Vec16 acc[M] = {};
    for (int64_t i = 0; i < k; i += 16) {
      // The weights stream from memory once per forward; fetching 4 KB ahead (the hardware
      // prefetcher alone did not keep up) made the bundled target's forward 6% faster at one
      // row and 12-16% at 3-24 rows. Reads past the matrix's end are prefetches only.
      __builtin_prefetch(wr + i + kWeightPrefetchFloats);
      const Vec16 wv = Load16(wr + i);
      for (int m = 0; m < M; ++m) acc[m] += Load16(x + m * k + i) * wv;
    }
    for (int m = 0; m < M; ++m) {
      float v = HorizontalSum(acc[m]);
      if (bias) v += bias[n];
      if (residual) v += residual[m * n_out + n];
      y[m * n_out + n] = v;
    }
  }
}

// f(std::integral_constant<int, M>{}) with M = rows for 1-7 rows and 8 for more: a kernel
// templated on its row count, picked at run time. Inlined (and so is f, which callers mark
// always_inline), so that it compiles for the caller's ISA clone.
template <typename F>
__attribute__((always_inline)) inline void WithRowCount(int64_t rows, const F& f) {
  switch (rows) {
    case 1:
      return f(std::integral_constant<int, 1>{});
    case 2:
      return f(std::integral_constant<int, 2>{});
    case 3:
      return f(std::integral_constant<int, 3>{});
    case 4:
      return f(std::integral_constant<int, 4>{});
    case 5:
      return f(std::integral_constant<int, 5>{});
    case 6:
      return f(std::integral_constant<int, 6>{});
    case 7:
      return f(std::integral_constant<int, 7>{});
    default:
      return f(std::integral_constant<int, 8>{});
  }
}

SPECULA_VECTOR_CLONES
void SmallMatmulBlock(const float* x, const float* w, const float* bias, const float* residual,
                      float* y, int64_t rows, int64_t n0, int64_t n1, int64_t n_out, int64_t k) {
  WithRowCount(
      rows, [&](auto m) __attribute__((always_inline)) {
        SmallMatmulT<decltype(m)::value>(x, w, bias, residual, y, n0, n1, n_out, k);
      });
}

#ifdef SPECULA_X86_KERNELS

// M (4-6) rows against 4 weight rows at a time, in registers: each loaded input vector serves four
// weight rows and each weight vector M inputs (M + 4 loads per 4M multiply-adds, against M + 1 per
// M in SmallMatmulT). Every output is summed exactly as SmallMatmulT sums it (the same lanes in
// the same order, the same horizontal sum), so results are bitwise SmallMatmulT's. Compiled for
// AVX-512 as a function of its own (not inlined into the clones), called only where it runs.
template <int M>
__attribute__((noinline, target("arch=x86-64-v4"))) void SmallMatmulTiles(
    const float* x, const float* w, const float* bias, const float* residual, float* y, int64_t n0,
    int64_t n1, int64_t n_out, int64_t k) {
  constexpr int R = 4;
  int64_t n = n0;
  for (; n + R <= n1; n += R) {
    Vec16 acc[M][R];
    for (int m = 0; m < M; ++m)
      for (int r = 0; r < R; ++r) acc[m][r] = Vec16{};
    for (int64_t i = 0; i < k; i += 16) {
      Vec16 wv[R];
      for (int r = 0; r < R; ++r) {
        __builtin_prefetch(w + (n + r) * k + i + kWeightPrefetchFloats);
        wv[r] = Load16(w + (n + r) * k + i);
      }
      for (int m = 0; m < M; ++m) {
        const Vec16 xv = Load16(x + m * k + i);
        for (int r = 0; r < R; ++r) acc[m][r] += xv * wv[r];
      }
    }
    for (int m = 0; m < M; ++m) {
      for (int r = 0; r < R; ++r) {
        float v = HorizontalSum(acc[m][r]);
        if (bias) v += bias[n + r];
        if (residual) v += residual[m * n_out + n + r];
        y[m * n_out + n + r] = v;
      }
    }
  }
  if (n < n1) SmallMatmulBlock(x, w, bias, residual, y, M, n, n1, n_out, k);
}
#endif

// Whether SmallMatmulTiles runs here: built for x86-64-v4 (AVX-512 F, CD, BW, DQ, VL; 32 zmm
// registers hold its up to 24 accumulators) and the CPU has it.
bool TilesRun() {
#ifdef SPECULA_X86_KERNELS
  static const bool run = DetectCpuVectorFeatures().avx512;
  return run;
#else
  return false;
#endif
}

// One block of rows against weight rows [n0, n1): the tiles for 4-6 rows where they run.
void SmallMatmulRows(const float* x, const float* w, const float* bias, const float* residual,
                     float* y, int64_t rows, int64_t n0, int64_t n1, int64_t n_out, int64_t k,
                     bool tiles) {
#ifdef SPECULA_X86_KERNELS
  if (tiles && rows == 6) return SmallMatmulTiles<6>(x, w, bias, residual, y, n0, n1, n_out, k);
  if (tiles && rows == 5) return SmallMatmulTiles<5>(x, w, bias, residual, y, n0, n1, n_out, k);
  if (tiles && rows == 4) return SmallMatmulTiles<4>(x, w, bias, residual, y, n0, n1, n_out, k);
#endif
  SmallMatmulBlock(x, w, bias, residual, y, rows, n0, n1, n_out, k);
}

// More than 8 rows: blocks of rows over tiles of weight rows small enough to stay in cache, so
// the weights are still read from memory once. Blocks of 8 rows, or with the AVX-512 tiles 6
// while at least 4 would remain (every block 4-6 rows).
void SmallMatmul(const float* x, const float* w, const float* bias, const float* residual, float* y,
                 int64_t rows, int64_t n0, int64_t n1, int64_t n_out, int64_t k) {
  if (rows <= 8) return SmallMatmulBlock(x, w, bias, residual, y, rows, n0, n1, n_out, k);
  const bool tiles = TilesRun();
  const int64_t tile = std::max<int64_t>(4, (int64_t{16} << 10) / k) / 4 * 4;  // ~64 KB of weights
  for (int64_t t0 = n0; t0 < n1; t0 += tile) {
    const int64_t t1 = std::min(n1, t0 + tile);
    for (int64_t m0 = 0; m0 < rows;) {
      const int64_t left = rows - m0;
      const int64_t block = !tiles       ? std::min<int64_t>(8, left)
                            : left <= 6  ? left
                            : left >= 10 ? 6
                                         : left - 4;
      SmallMatmulRows(x + m0 * k, w, bias, residual ? residual + m0 * n_out : nullptr,
                      y + m0 * n_out, block, t0, t1, n_out, k, tiles);
      m0 += block;
    }
  }
}

#ifdef SPECULA_X86_KERNELS

// The packed weights' panels (PackMatmulWeights): for output group g (16 outputs) and lane j,
// the k / 16 vectors packed[g][j][i][c] = w[16 g + c][16 i + j], contiguous in i.
inline const float* PanelOf(const float* packed, int64_t g, int j, int64_t k) {
  return packed + (g * 16 + j) * k;
}

// M rows against G groups of 16 outputs. SmallMatmulT keeps, for each output, 16 lane sums
// (lane j: the products of inputs 16 i + j in increasing i) and adds them in HorizontalSum's
// tree. Here the lanes of a vector are 16 outputs instead: lane j's sums of 16 outputs at once,
// from a broadcast input times a panel vector, in the same order, then the same tree as vector
// adds. So every output is bitwise SmallMatmulT's, without its shuffles per output, and each
// broadcast serves G panel vectors and each panel vector M rows. The lane sums wait in `part`
// (L1) until all 16 lanes are done.
template <int M, int G>
__attribute__((noinline, target("arch=x86-64-v4"))) void PackedMatmulTile(
    const float* x, const float* packed, const float* bias, const float* residual, float* y,
    int64_t g0, int64_t g1, int64_t n_out, int64_t k) {
  const int64_t steps = k / 16;
  alignas(64) float part[M][G][16][16];
  for (int64_t g = g0; g + G <= g1; g += G) {
    for (int j = 0; j < 16; ++j) {
      Vec16 acc[M][G];
      for (int m = 0; m < M; ++m)
        for (int c = 0; c < G; ++c) acc[m][c] = Vec16{};
      const float* panel[G];
      for (int c = 0; c < G; ++c) panel[c] = PanelOf(packed, g + c, j, k);
      for (int64_t i = 0; i < steps; ++i) {
        Vec16 wv[G];
        for (int c = 0; c < G; ++c) {
          __builtin_prefetch(panel[c] + i * 16 + kWeightPrefetchFloats);
          wv[c] = Load16(panel[c] + i * 16);
        }
        for (int m = 0; m < M; ++m) {
          const Vec16 xv = reinterpret_cast<Vec16>(_mm512_set1_ps(x[m * k + i * 16 + j]));
          for (int c = 0; c < G; ++c) acc[m][c] += xv * wv[c];
        }
      }
      for (int m = 0; m < M; ++m)
        for (int c = 0; c < G; ++c) Store16(part[m][c][j], acc[m][c]);
    }
    for (int m = 0; m < M; ++m) {
      for (int c = 0; c < G; ++c) {
        Vec16 h[8];
        for (int j = 0; j < 8; ++j) h[j] = Load16(part[m][c][j]) + Load16(part[m][c][j + 8]);
        Vec16 v = (h[0] + h[4] + (h[2] + h[6])) + (h[1] + h[5] + (h[3] + h[7]));
        const int64_t n = (g + c) * 16;
        if (bias) v += Load16(bias + n);
        if (residual) v += Load16(residual + m * n_out + n);
        Store16(y + m * n_out + n, v);
      }
    }
  }
}

// Groups per tile for a block of `rows` (1-8) rows: rows * G accumulators, G panel vectors and a
// broadcast within the 32 zmm registers, the most that measured fastest (the bundled target's
// matmuls, one core).
constexpr int PackedGroups(int64_t rows) { return rows <= 6 ? 4 : 3; }

// Groups [g0, g1) for a block of M rows: whole tiles, then one narrower tile of what is left.
template <int M>
void PackedMatmulRowBlock(const float* x, const float* packed, const float* bias,
                          const float* residual, float* y, int64_t g0, int64_t g1, int64_t n_out,
                          int64_t k) {
  constexpr int G = PackedGroups(M);
  const int64_t whole = g0 + (g1 - g0) / G * G;
  PackedMatmulTile<M, G>(x, packed, bias, residual, y, g0, whole, n_out, k);
  switch (g1 - whole) {
    case 1:
      return PackedMatmulTile<M, 1>(x, packed, bias, residual, y, whole, g1, n_out, k);
    case 2:
      return PackedMatmulTile<M, 2>(x, packed, bias, residual, y, whole, g1, n_out, k);
    case 3:
      if constexpr (G > 3) {
        return PackedMatmulTile<M, 3>(x, packed, bias, residual, y, whole, g1, n_out, k);
      }
  }
}

void PackedMatmulRows(const float* x, int64_t rows, const float* packed, const float* bias,
                      const float* residual, float* y, int64_t g0, int64_t g1, int64_t n_out,
                      int64_t k) {
  WithRowCount(
      rows, [&](auto m) __attribute__((always_inline)) {
        PackedMatmulRowBlock<decltype(m)::value>(x, packed, bias, residual, y, g0, g1, n_out, k);
      });
}

// Groups [g0, g1) for every row: up to 8 rows in one pass; more in blocks of 8 over tiles of
// ~128 KB of panels, so that the panels come from memory once and from L2 for the other blocks.
void PackedMatmul(const float* x, int64_t rows, const float* packed, const float* bias,
                  const float* residual, float* y, int64_t g0, int64_t g1, int64_t n_out,
                  int64_t k) {
  if (rows <= 8) return PackedMatmulRows(x, rows, packed, bias, residual, y, g0, g1, n_out, k);
  const int64_t tile = std::max<int64_t>(3, (int64_t{32} << 10) / (16 * k) / 3 * 3);
  for (int64_t t0 = g0; t0 < g1; t0 += tile) {
    const int64_t t1 = std::min(g1, t0 + tile);
    for (int64_t m0 = 0; m0 < rows; m0 += 8) {
      PackedMatmulRows(x + m0 * k, std::min<int64_t>(8, rows - m0), packed, bias,
                       residual ? residual + m0 * n_out : nullptr, y + m0 * n_out, t0, t1, n_out,
                       k);
    }
  }
}

// The int8 panels (PackInt8MatmulWeights): group g's k vectors of 16 outputs' weights, one per
// input, contiguous.
inline const int8_t* Int8PanelOf(const int8_t* packed, int64_t g, int64_t k) {
  return packed + g * k * 16;
}

// M rows against G groups of 16 outputs, as PackedMatmulTile's outer products but each input's
// 16 weights widened from int8 once for all M rows, and the sums scaled per output at the end.
// Four inputs (one cache line of a panel) per pass of the loop.
template <int M, int G>
__attribute__((noinline, target("arch=x86-64-v4"))) void Int8MatmulTile(
    const float* x, const int8_t* packed, const float* scales, const float* bias,
    const float* residual, float* y, int64_t g0, int64_t g1, int64_t n_out, int64_t k) {
  constexpr int64_t kAheadBytes = kWeightPrefetchFloats * 4;
  for (int64_t g = g0; g + G <= g1; g += G) {
    __m512 acc[M][G];
    for (int m = 0; m < M; ++m)
      for (int c = 0; c < G; ++c) acc[m][c] = _mm512_setzero_ps();
    const int8_t* panel[G];
    for (int c = 0; c < G; ++c) panel[c] = Int8PanelOf(packed, g + c, k);
    for (int64_t p = 0; p < k; p += 4) {
      for (int c = 0; c < G; ++c) __builtin_prefetch(panel[c] + p * 16 + kAheadBytes);
      for (int u = 0; u < 4; ++u) {
        __m512 wv[G];
        for (int c = 0; c < G; ++c) {
          const __m128i q =
              _mm_loadu_si128(reinterpret_cast<const __m128i*>(panel[c] + (p + u) * 16));
          wv[c] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q));
        }
        for (int m = 0; m < M; ++m) {
          const __m512 xv = _mm512_set1_ps(x[m * k + p + u]);
          for (int c = 0; c < G; ++c) acc[m][c] = _mm512_fmadd_ps(xv, wv[c], acc[m][c]);
        }
      }
    }
    for (int m = 0; m < M; ++m) {
      for (int c = 0; c < G; ++c) {
        const int64_t n = (g + c) * 16;
        __m512 v = _mm512_mul_ps(acc[m][c], _mm512_loadu_ps(scales + n));
        if (bias) v = _mm512_add_ps(v, _mm512_loadu_ps(bias + n));
        if (residual) v = _mm512_add_ps(v, _mm512_loadu_ps(residual + m * n_out + n));
        _mm512_storeu_ps(y + m * n_out + n, v);
      }
    }
  }
}

// Groups per tile for a block of M rows: M * G accumulators, G widened weight vectors and a
// broadcast within the 32 zmm registers; one row gets eight chains to hide the FMA latency.
constexpr int Int8Groups(int m) { return m == 1 ? 8 : m == 2 ? 6 : m <= 4 ? 4 : 3; }

void Int8MatmulRows(const float* x, int64_t rows, const int8_t* packed, const float* scales,
                    const float* bias, const float* residual, float* y, int64_t g0, int64_t g1,
                    int64_t n_out, int64_t k) {
  WithRowCount(
      rows, [&](auto mc) __attribute__((always_inline)) {
        constexpr int M = decltype(mc)::value;
        constexpr int G = Int8Groups(M);
        const int64_t whole = g0 + (g1 - g0) / G * G;
        Int8MatmulTile<M, G>(x, packed, scales, bias, residual, y, g0, whole, n_out, k);
        Int8MatmulTile<M, 1>(x, packed, scales, bias, residual, y, whole, g1, n_out, k);
      });
}

// Groups [g0, g1) for every row: up to 8 rows in one pass; more in blocks of 8 over tiles of
// ~32 KB of panels, which stay in L1/L2 for the later blocks.
void Int8Matmul(const float* x, int64_t rows, const int8_t* packed, const float* scales,
                const float* bias, const float* residual, float* y, int64_t g0, int64_t g1,
                int64_t n_out, int64_t k) {
  if (rows <= 8) {
    return Int8MatmulRows(x, rows, packed, scales, bias, residual, y, g0, g1, n_out, k);
  }
  const int64_t tile = std::max<int64_t>(1, (int64_t{32} << 10) / (16 * k));
  for (int64_t t0 = g0; t0 < g1; t0 += tile) {
    const int64_t t1 = std::min(g1, t0 + tile);
    for (int64_t m0 = 0; m0 < rows; m0 += 8) {
      Int8MatmulRows(x + m0 * k, std::min<int64_t>(8, rows - m0), packed, scales, bias,
                     residual ? residual + m0 * n_out : nullptr, y + m0 * n_out, t0, t1, n_out, k);
    }
  }
}

// x's rows (count floats, a multiple of 32) rounded to bfloat16, nearest even.
__attribute__((noinline, target("arch=x86-64-v4,avx512bf16"))) void RoundToBf16(const float* x,
                                                                                int64_t count,
                                                                                uint16_t* out) {
  for (int64_t i = 0; i < count; i += 32) {
    const __m512bh both = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + i + 16), _mm512_loadu_ps(x + i));
    _mm512_storeu_si512(out + i, reinterpret_cast<__m512i>(both));
  }
}

__attribute__((always_inline, target("arch=x86-64-v4,avx512bf16"))) inline __m512bh LoadBf16x32(
    const uint16_t* p) {
  return reinterpret_cast<__m512bh>(_mm512_loadu_si512(p));
}

__attribute__((always_inline, target("arch=x86-64-v4,avx512bf16"))) inline void StoreBf16Out(
    __m512 acc, const float* bias, const float* residual, float* y, int64_t m, int64_t n,
    int64_t n_out) {
  float v = HorizontalSum(reinterpret_cast<Vec16>(acc));
  if (bias) v += bias[n];
  if (residual) v += residual[m * n_out + n];
  y[m * n_out + n] = v;
}

// y[m][n] for weight rows [n0, n1): four weight rows at a time against each input row in turn
// (the four stay in L1 across the rows; four independent accumulators keep the dot-product unit
// busy where one row's chain of k / 32 dependent instructions would not).
__attribute__((noinline, target("arch=x86-64-v4,avx512bf16"))) void Bf16MatmulBlock(
    const uint16_t* x, int64_t rows, const uint16_t* w, const float* bias, const float* residual,
    float* y, int64_t n0, int64_t n1, int64_t n_out, int64_t k) {
  // As far ahead as the float32 kernel fetches, in bytes.
  constexpr int64_t kAhead = kWeightPrefetchFloats * 2;
  int64_t n = n0;
  for (; n + 4 <= n1; n += 4) {
    const uint16_t* w0 = w + n * k;
    const uint16_t* w1 = w0 + k;
    const uint16_t* w2 = w1 + k;
    const uint16_t* w3 = w2 + k;
    for (int64_t m = 0; m < rows; ++m) {
      const uint16_t* xr = x + m * k;
      __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
      for (int64_t i = 0; i < k; i += 32) {
        if (m == 0) {
          __builtin_prefetch(w0 + i + kAhead);
          __builtin_prefetch(w1 + i + kAhead);
          __builtin_prefetch(w2 + i + kAhead);
          __builtin_prefetch(w3 + i + kAhead);
        }
        const __m512bh xv = LoadBf16x32(xr + i);
        a0 = _mm512_dpbf16_ps(a0, xv, LoadBf16x32(w0 + i));
        a1 = _mm512_dpbf16_ps(a1, xv, LoadBf16x32(w1 + i));
        a2 = _mm512_dpbf16_ps(a2, xv, LoadBf16x32(w2 + i));
        a3 = _mm512_dpbf16_ps(a3, xv, LoadBf16x32(w3 + i));
      }
      StoreBf16Out(a0, bias, residual, y, m, n, n_out);
      StoreBf16Out(a1, bias, residual, y, m, n + 1, n_out);
      StoreBf16Out(a2, bias, residual, y, m, n + 2, n_out);
      StoreBf16Out(a3, bias, residual, y, m, n + 3, n_out);
    }
  }
  for (; n < n1; ++n) {
    const uint16_t* wr = w + n * k;
    for (int64_t m = 0; m < rows; ++m) {
      __m512 acc = _mm512_setzero_ps();
      for (int64_t i = 0; i < k; i += 32) {
        acc = _mm512_dpbf16_ps(acc, LoadBf16x32(x + m * k + i), LoadBf16x32(wr + i));
      }
      StoreBf16Out(acc, bias, residual, y, m, n, n_out);
    }
  }
}
#endif

void CheckRows(const at::Tensor& t, const char* what) {
  TORCH_CHECK(CpuKernelsApply(t), what, " must be a float32 CPU tensor");
  TORCH_CHECK(t.stride(-1) == 1, what, " must have a contiguous last dimension");
}

}  // namespace

bool SmallMatmulApplies(const at::Tensor& x, const at::Tensor& weight) {
  return CpuKernelsApply(x) && CpuKernelsApply(weight) && x.dim() == 2 && x.size(0) >= 1 &&
         x.size(0) <= kSmallMatmulMaxRows && x.size(1) % 16 == 0 && weight.is_contiguous() &&
         weight.dim() == 2 && weight.size(1) == x.size(1);
}

void SmallMatmulRaw(const float* x, int64_t rows, int64_t k, const float* weight, int64_t n,
                    const float* bias, const float* residual, float* y) {
  TORCH_CHECK(rows >= 1 && rows <= kSmallMatmulMaxRows && k % 16 == 0, "SmallMatmulRaw: ", rows,
              " rows of ", k);
  // Output features split across threads once each gets ~32K multiply-adds (the weights are read
  // once either way; two cores read them twice as fast). At one row a 256 x 256 projection then
  // runs on both cores: 4x that bound kept it on one and made a batch-1 forward 15% slower.
  const int64_t grain = std::max<int64_t>(16, (int64_t{1} << 15) / (k * rows));
  // Every core: OpenBLAS's pool is idle while this kernel runs (see PagedAttentionCpu).
  ParallelRanges(0, n, grain, KernelThreads(), [&](int64_t n0, int64_t n1) {
    SmallMatmul(x, weight, bias, residual, y, rows, n0, n1, n, k);
  });
}

bool Bf16MatmulRuns() {
#ifdef SPECULA_X86_KERNELS
  static const bool run = DetectCpuVectorFeatures().avx512_bf16;
  return run;
#else
  return false;
#endif
}

void SmallMatmulBf16Raw(const float* x, int64_t rows, int64_t k, const uint16_t* weight, int64_t n,
                        const float* bias, const float* residual, float* y) {
  TORCH_CHECK(rows >= 1 && rows <= kSmallMatmulMaxRows && k % 32 == 0, "SmallMatmulBf16Raw: ", rows,
              " rows of ", k);
  TORCH_CHECK(Bf16MatmulRuns(), "SmallMatmulBf16Raw: this CPU or build has no AVX512-BF16");
#ifdef SPECULA_X86_KERNELS
  // The rows rounded once, on this thread, for every range.
  thread_local std::vector<uint16_t> rounded;
  if (static_cast<int64_t>(rounded.size()) < rows * k) rounded.resize(rows * k);
  RoundToBf16(x, rows * k, rounded.data());
  const uint16_t* xb = rounded.data();
  // Half the bytes per weight of the float32 kernel, and the same split: ~32K multiply-adds each.
  const int64_t grain = std::max<int64_t>(16, (int64_t{1} << 15) / (k * rows));
  ParallelRanges(0, n, grain, KernelThreads(), [&](int64_t n0, int64_t n1) {
    Bf16MatmulBlock(xb, rows, weight, bias, residual, y, n0, n1, n, k);
  });
#else
  (void)x, (void)weight, (void)n, (void)bias, (void)residual, (void)y;
#endif
}

bool PackedMatmulRuns() { return TilesRun(); }

void PackMatmulWeights(const float* weight, int64_t n, int64_t k, float* packed) {
  TORCH_CHECK(n % 16 == 0 && k % 16 == 0, "PackMatmulWeights: ", n, " x ", k,
              " is not in whole 16 x 16 blocks");
  for (int64_t g = 0; g < n / 16; ++g) {
    for (int j = 0; j < 16; ++j) {
      float* panel = packed + (g * 16 + j) * k;
      for (int64_t i = 0; i < k / 16; ++i) {
        for (int c = 0; c < 16; ++c) panel[i * 16 + c] = weight[(g * 16 + c) * k + i * 16 + j];
      }
    }
  }
}

void PackedMatmulRaw(const float* x, int64_t rows, int64_t k, const float* packed, int64_t n,
                     const float* bias, const float* residual, float* y) {
  TORCH_CHECK(rows >= 1 && rows <= kSmallMatmulMaxRows && k % 16 == 0 && n % 16 == 0,
              "PackedMatmulRaw: ", rows, " rows of ", k, " to ", n);
  TORCH_CHECK(PackedMatmulRuns(), "PackedMatmulRaw: this CPU or build has no AVX-512");
#ifdef SPECULA_X86_KERNELS
  // SmallMatmulRaw's split (~32K multiply-adds per range), in whole tiles of 16-output groups so
  // that no range is left with a narrow tile.
  const int64_t groups = n / 16;
  const int64_t unit = PackedGroups(std::min<int64_t>(rows, 8));  // the widest row block's
  const int64_t grain = std::max<int64_t>(16, (int64_t{1} << 15) / (k * rows));
  ParallelRanges(0, (groups + unit - 1) / unit, (grain + 16 * unit - 1) / (16 * unit),
                 KernelThreads(), [&](int64_t u0, int64_t u1) {
                   PackedMatmul(x, rows, packed, bias, residual, y, u0 * unit,
                                std::min(groups, u1 * unit), n, k);
                 });
#else
  (void)x, (void)packed, (void)bias, (void)residual, (void)y;
#endif
}

bool Int8MatmulRuns() { return TilesRun(); }

void PackInt8MatmulWeights(const float* weight, int64_t n, int64_t k, int8_t* packed,
                           float* scales) {
  TORCH_CHECK(n % 16 == 0 && k % 4 == 0, "PackInt8MatmulWeights: ", n, " x ", k,
              " is not in whole groups of 16 outputs and 4 inputs");
  for (int64_t r = 0; r < n; ++r) {
    const float* row = weight + r * k;
    float amax = 0;
    for (int64_t p = 0; p < k; ++p) amax = std::max(amax, std::fabs(row[p]));
    // A row of zeros (or one that is not finite) gets scale 0: its outputs are 0 (+ bias).
    const bool usable = amax > 0 && std::isfinite(amax);
    scales[r] = usable ? amax / 127.0f : 0.0f;
    const float inverse = usable ? 127.0f / amax : 0.0f;
    int8_t* out = packed + (r / 16) * k * 16 + r % 16;
    for (int64_t p = 0; p < k; ++p) {
      const float q = std::nearbyint(row[p] * inverse);
      out[p * 16] = static_cast<int8_t>(std::clamp(q, -127.0f, 127.0f));
    }
  }
}

void Int8MatmulRaw(const float* x, int64_t rows, int64_t k, const int8_t* packed,
                   const float* scales, int64_t n, const float* bias, const float* residual,
                   float* y) {
  TORCH_CHECK(rows >= 1 && rows <= kSmallMatmulMaxRows && k % 4 == 0 && n % 16 == 0,
              "Int8MatmulRaw: ", rows, " rows of ", k, " to ", n);
  TORCH_CHECK(Int8MatmulRuns(), "Int8MatmulRaw: this CPU or build has no AVX-512");
#ifdef SPECULA_X86_KERNELS
  // A quarter of the float32 weights' bytes and the widening per weight vector: ~64K
  // multiply-adds per range, so that the small products of a draft LM's step stay on one thread.
  const int64_t groups = n / 16;
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 16) / (k * rows * 16));
  ParallelRanges(0, groups, grain, KernelThreads(), [&](int64_t g0, int64_t g1) {
    Int8Matmul(x, rows, packed, scales, bias, residual, y, g0, g1, n, k);
  });
#else
  (void)x, (void)packed, (void)scales, (void)bias, (void)residual, (void)y;
#endif
}

at::Tensor SmallMatmulCpu(const at::Tensor& x_in, const at::Tensor& weight, const at::Tensor& bias,
                          const at::Tensor* residual) {
  TORCH_CHECK(SmallMatmulApplies(x_in, weight), "SmallMatmulCpu: unsupported shapes");
  const at::Tensor x = x_in.contiguous();
  const int64_t rows = x.size(0), n = weight.size(0), k = x.size(1);
  at::Tensor b = bias.defined() ? bias.contiguous() : at::Tensor();
  at::Tensor res = residual ? residual->contiguous() : at::Tensor();
  TORCH_CHECK(!b.defined() || (CpuKernelsApply(b) && b.numel() == n), "bad bias");
  TORCH_CHECK(!res.defined() || (CpuKernelsApply(res) && res.numel() == rows * n), "bad residual");
  at::Tensor y = at::empty({rows, n}, x.options());
  SmallMatmulRaw(x.data_ptr<float>(), rows, k, weight.data_ptr<float>(), n,
                 b.defined() ? b.data_ptr<float>() : nullptr,
                 res.defined() ? res.data_ptr<float>() : nullptr, y.data_ptr<float>());
  return y;
}

SPECULA_VECTOR_CLONES
float SumExpBelow(const float* x, int64_t n, float shift) {
  float acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int t = 0; t < kLanes; ++t) acc[t] += ExpNonPositive(x[i + t] - shift);
  }
  float s = 0;
  for (int t = 0; t < kLanes; ++t) s += acc[t];
  for (; i < n; ++i) s += ExpNonPositive(x[i] - shift);
  return s;
}

SPECULA_VECTOR_CLONES
float ExpBelowRaw(const float* x, int64_t n, float shift, float* out) {
  constexpr float kMinusInf = -std::numeric_limits<float>::infinity();
  float acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int t = 0; t < kLanes; ++t) {
      const float e = x[i + t] == kMinusInf ? 0.0f : ExpNonPositive(x[i + t] - shift);
      out[i + t] = e;
      acc[t] += e;
    }
  }
  float s = 0;
  for (int t = 0; t < kLanes; ++t) s += acc[t];
  for (; i < n; ++i) {
    out[i] = x[i] == kMinusInf ? 0.0f : ExpNonPositive(x[i] - shift);
    s += out[i];
  }
  return s;
}

void RmsNormRaw(const float* x, const float* weight, float* out, int64_t rows, int64_t d,
                double eps) {
  RmsNormRows(x, weight, out, rows, d, static_cast<float>(eps));
}

void SiluMulRaw(const float* gate_up, float* out, int64_t rows, int64_t f) {
  // Rows split across the cores once each gets ~8K outputs: one core's pass over 16 rows of the
  // bundled target's 768 features made a 16-row forward 5% slower than LibTorch's two-thread
  // silu and mul. Each output is computed the same way whatever the split.
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 13) / std::max<int64_t>(f, 1));
  ParallelRanges(0, rows, grain, KernelThreads(), [&](int64_t r0, int64_t r1) {
    SiluMulRows(gate_up + r0 * 2 * f, out + r0 * f, r1 - r0, f);
  });
}

bool CpuKernelsApply(const at::Tensor& t) {
  return t.defined() && t.device().is_cpu() && t.scalar_type() == at::kFloat;
}

at::Tensor RmsNormCpu(const at::Tensor& x_in, const at::Tensor& weight, double eps) {
  at::Tensor x = x_in.contiguous();
  CheckRows(x, "rms norm input");
  const int64_t d = x.size(-1), rows = x.numel() / d;
  at::Tensor w = weight.contiguous();
  at::Tensor out = at::empty_like(x);
  RmsNormRows(x.data_ptr<float>(), w.data_ptr<float>(), out.data_ptr<float>(), rows, d,
              static_cast<float>(eps));
  return out;
}

at::Tensor SiluMulCpu(const at::Tensor& gate_up_in) {
  at::Tensor gu = gate_up_in.contiguous();
  CheckRows(gu, "gate_up");
  const int64_t f = gu.size(-1) / 2, rows = gu.numel() / std::max<int64_t>(1, 2 * f);
  std::vector<int64_t> shape = gu.sizes().vec();
  shape.back() = f;
  at::Tensor out = at::empty(shape, gu.options());
  SiluMulRaw(gu.data_ptr<float>(), out.data_ptr<float>(), rows, f);
  return out;
}

void RopeAndCacheRaw(const RopeRows& rows, int64_t num_slots, float* key_cache, float* value_cache,
                     float* q_out) {
  const int64_t nh = rows.num_heads, nkv = rows.num_kv_heads, hd = rows.head_dim;
  const int64_t slot_floats = nkv * hd;
  for (int64_t i = 0; i < rows.rows; ++i) {
    const int64_t slot = rows.write_slots[i];
    TORCH_CHECK(slot >= 0 && slot < num_slots, "write slot ", slot, " outside the cache");
    const float* cos = rows.cos + rows.cos_row[i] * hd;
    const float* sin = rows.sin + rows.cos_row[i] * hd;
    if (nh > 0) {
      RotateRow(rows.q + i * rows.q_stride, cos, sin, q_out + i * nh * hd, nh, rows.q_head_stride,
                hd);
    }
    RotateRow(rows.k + i * rows.k_stride, cos, sin, key_cache + slot * slot_floats, nkv,
              rows.k_head_stride, hd);
    float* vdst = value_cache + slot * slot_floats;
    for (int64_t h = 0; h < nkv; ++h) {
      std::memcpy(vdst + h * hd, rows.v + i * rows.v_stride + h * rows.v_head_stride,
                  hd * sizeof(float));
    }
  }
}

void RopeRaw(const float* x, int64_t rows, int64_t stride, int64_t heads, int64_t head_stride,
             int64_t head_dim, const float* cos, const float* sin, const int64_t* cos_row,
             float* out) {
  for (int64_t i = 0; i < rows; ++i) {
    RotateRow(x + i * stride, cos + cos_row[i] * head_dim, sin + cos_row[i] * head_dim,
              out + i * heads * head_dim, heads, head_stride, head_dim);
  }
}

at::Tensor RopeAndCacheCpu(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const at::Tensor& cos_in, const at::Tensor& sin_in,
                           const std::vector<int64_t>& write_slots, at::Tensor& key_cache,
                           at::Tensor& value_cache) {
  CheckRows(q, "q");
  CheckRows(k, "k");
  CheckRows(v, "v");
  CheckRows(key_cache, "key cache");
  CheckRows(value_cache, "value cache");
  TORCH_CHECK(key_cache.is_contiguous() && value_cache.is_contiguous(),
              "caches must be contiguous");
  const at::Tensor cos = cos_in.contiguous(), sin = sin_in.contiguous();
  CheckRows(cos, "cos");
  CheckRows(sin, "sin");
  const int64_t N = q.size(0), nh = q.size(1), nkv = k.size(1), hd = q.size(2);
  TORCH_CHECK(static_cast<int64_t>(write_slots.size()) == N, "one write slot per row");
  TORCH_CHECK(k.stride(1) == hd || nkv == 1, "k heads must be head_dim apart");
  at::Tensor q_out = at::empty({N, nh, hd}, q.options());
  std::vector<int64_t> cos_row(N);
  for (int64_t i = 0; i < N; ++i) cos_row[i] = i;
  RopeAndCacheRaw({.q = q.data_ptr<float>(),
                   .k = k.data_ptr<float>(),
                   .v = v.data_ptr<float>(),
                   .q_stride = q.stride(0),
                   .k_stride = k.stride(0),
                   .v_stride = v.stride(0),
                   .q_head_stride = q.stride(1),
                   .k_head_stride = k.stride(1),
                   .v_head_stride = v.stride(1),
                   .rows = N,
                   .num_heads = nh,
                   .num_kv_heads = nkv,
                   .head_dim = hd,
                   .cos = cos.data_ptr<float>(),
                   .sin = sin.data_ptr<float>(),
                   .cos_row = cos_row.data(),
                   .write_slots = write_slots.data()},
                  key_cache.size(0), key_cache.data_ptr<float>(), value_cache.data_ptr<float>(),
                  q_out.data_ptr<float>());
  return q_out;
}

namespace {

// Own keys per row for PagedAttentionInto (see RowKeys): [rows, row_keys, nkv, hd].
void PagedAttentionInto(const float* qp, int64_t N, int64_t nh, int64_t hd, int64_t nkv,
                        const float* kc, const float* vc, const PagedAttentionLayout& layout,
                        const RowKeysRaw* row_keys, float* op) {
  TORCH_CHECK(N == layout.num_rows(), "q has ", N, " rows, the layout ", layout.num_rows());
  TORCH_CHECK(nkv > 0 && nh % nkv == 0 && nh <= kMaxHeads, "unsupported heads ", nh, "/", nkv);
  if (N == 0) return;
  TORCH_CHECK(hd <= kMaxHeadDim, "head_dim ", hd, " above ", kMaxHeadDim);
  const int64_t group = nh / nkv;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  // Tasks: runs of consecutive rows of one sequence, at most kMaxVectors / nh rows each.
  const int64_t max_rows = std::max<int64_t>(1, kMaxVectors / nh);
  std::vector<int64_t> run_start;
  for (int64_t r = 0; r < N; ++r) {
    if (run_start.empty() || layout.row_sequence(r) != layout.row_sequence(r - 1) ||
        r - run_start.back() >= max_rows) {
      run_start.push_back(r);
    }
  }
  const int64_t runs = static_cast<int64_t>(run_start.size());
  run_start.push_back(N);
  // A run is split into tasks by key/value heads when there are too few runs to keep the threads
  // busy (batch 1: one run, its 4-16 query vectors on one core while the other waited, a third of
  // a drafted step at context 256). Each task reads only its heads' keys and values, and every
  // query vector is computed exactly as in one task (the same keys in the same chunks), so the
  // split changes no value.
  const int max_threads = KernelThreads();
  int64_t splits = 1;
  if (max_threads > 1 && runs < 2 * max_threads) {
    splits = std::min<int64_t>(nkv, (2 * max_threads + runs - 1) / runs);
  }
  const int64_t tasks = runs * splits;
  // Tasks go in parallel once a thread gets ~16K multiply-adds (~5 us of this kernel; a job on the
  // pool costs ~1 us): at batch 1 and a short context the work is less than a fork.
  const int64_t work_per_task = std::max<int64_t>(1, layout.total_visible() * nh * hd / tasks);
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 14) / work_per_task);
  // Keys and values read ahead once this layer's cache read outgrows the caches: at batch 32 and
  // context 256-384 (8-13 MB a layer) the forward ran 8-24% faster with it; at batch 1-4 (under
  // 2 MB, already cached) the extra instructions made it 1.5-2.5% slower.
  const bool prefetch =
      layout.total_visible() * nkv * hd * 2 * static_cast<int64_t>(sizeof(float)) >=
      kKvPrefetchBytes;
  // Every forward splits attention across the kernel pool, also those whose projections run on
  // OpenBLAS's threads: the pool never waits for a helper that is late (one still spinning in
  // OpenBLAS's pool, say), so the worst case is one core. OpenMP's workers did wait (batch 64 x 1
  // at context 384 went 25 -> 49 ms); this pool took batch 64 x 8 at context 384 from 122 to 78 ms.
  ParallelRanges(0, tasks, grain, max_threads, [&](int64_t begin, int64_t end) {
    float m[kMaxVectors], l[kMaxVectors];
    const float* q[kMaxVectors];
    float* out[kMaxVectors];
    int64_t kv_offset[kMaxVectors];
    for (int64_t t = begin; t < end; ++t) {
      const int64_t run = t / splits, split = t % splits;
      const int64_t r0 = run_start[run], r1 = run_start[run + 1];
      // This task's key/value heads [g0, g1) and their query heads [h0, h0 + heads).
      const int64_t g0 = split * nkv / splits, g1 = (split + 1) * nkv / splits;
      const int64_t h0 = g0 * group, heads = (g1 - g0) * group;
      for (int64_t r = r0; r < r1; ++r) {
        for (int64_t h = 0; h < heads; ++h) {
          const int64_t i = (r - r0) * heads + h;
          q[i] = qp + (r * nh + h0 + h) * hd;
          out[i] = op + (r * nh + h0 + h) * hd;
          kv_offset[i] = ((h0 + h) / group) * hd;
        }
      }
      AttendArgs a{.q = q,
                   .kc = kc,
                   .vc = vc,
                   .nh = heads,
                   .nkv = nkv,
                   .hd = hd,
                   .scale = scale,
                   .out = out,
                   .m = m,
                   .l = l,
                   .kv_offset = kv_offset,
                   .prefetch = prefetch};
      if (row_keys != nullptr) {
        a.rk = row_keys->keys;
        a.rv = row_keys->values;
        a.row_keys = row_keys->row_keys;
        a.row_key_count = row_keys->counts;
      }
      AttendRows(a, layout, r0, r1);
    }
  });
}

}  // namespace

void PagedAttentionRaw(const float* q, int64_t rows, int64_t num_heads, int64_t head_dim,
                       int64_t num_kv_heads, const float* key_cache, const float* value_cache,
                       const PagedAttentionLayout& layout, float* out, const RowKeysRaw* row_keys) {
  PagedAttentionInto(q, rows, num_heads, head_dim, num_kv_heads, key_cache, value_cache, layout,
                     row_keys, out);
}

at::Tensor PagedAttentionCpu(const at::Tensor& q_in, const at::Tensor& key_cache,
                             const at::Tensor& value_cache, const PagedAttentionLayout& layout,
                             const RowKeys* row_keys) {
  const at::Tensor q = q_in.contiguous();
  CheckRows(q, "q");
  CheckRows(key_cache, "key cache");
  CheckRows(value_cache, "value cache");
  const int64_t N = q.size(0), nh = q.size(1), hd = q.size(2), nkv = key_cache.size(1);
  TORCH_CHECK(N == layout.num_rows(), "q has ", N, " rows, the layout ", layout.num_rows());
  at::Tensor rk, rv;
  RowKeysRaw raw_keys{};
  if (row_keys != nullptr) {
    rk = row_keys->keys.contiguous();
    rv = row_keys->values.contiguous();
    CheckRows(rk, "row keys");
    CheckRows(rv, "row values");
    TORCH_CHECK(rk.dim() == 4 && rk.size(0) == N && rk.size(2) == nkv && rk.size(3) == hd &&
                    rv.sizes() == rk.sizes(),
                "row keys/values must be [", N, ", D, ", nkv, ", ", hd, "]");
    TORCH_CHECK(static_cast<int64_t>(row_keys->counts.size()) == N,
                "row key counts: ", row_keys->counts.size(), " for ", N, " rows");
    for (int32_t c : row_keys->counts) {
      TORCH_CHECK(c >= 0 && c <= rk.size(1), "row key count ", c, " outside [0, ", rk.size(1), "]");
    }
    raw_keys = {.keys = rk.data_ptr<float>(),
                .values = rv.data_ptr<float>(),
                .row_keys = rk.size(1),
                .counts = row_keys->counts.data()};
  }
  TORCH_CHECK(nh % nkv == 0 && nh <= kMaxHeads, "unsupported heads ", nh, "/", nkv);
  at::Tensor out = at::empty({N, nh * hd}, q.options());
  PagedAttentionInto(q.data_ptr<float>(), N, nh, hd, nkv, key_cache.data_ptr<float>(),
                     value_cache.data_ptr<float>(), layout, row_keys ? &raw_keys : nullptr,
                     out.data_ptr<float>());
  return out;
}

}  // namespace specula
