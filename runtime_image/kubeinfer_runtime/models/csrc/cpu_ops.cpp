// CPU kernels for the decode path: what eager PyTorch spends ~40 small ops per layer on, and the
// weight-streaming matmul a few-row product is bound by.
//
// A batch-1 decode step on a small model is bound by memory bandwidth in its matmuls; every other op
// costs a few microseconds of dispatch for almost no arithmetic. These kernels fold that glue into
// four calls per layer: residual add + RMSNorm, rotary embedding + KV-cache write, attention over the
// paged cache (no gather copy, every decode sequence in one call), and SiLU-and-multiply.
//
// Activations are float32 or bfloat16 (computed in float32, rounded to bfloat16 where transformers'
// bfloat16 modules round, so both give the same numbers); matmul weights are float32, bfloat16, or
// int8 with one float32 scale per output row (weight-only quantization, dequantized in registers).
// The vector width is the widest the build targets: AVX-512 where the compiler is told the machine
// has it (-march=native on such a machine), else AVX2 + FMA, else plain loops the compiler vectorises
// as it can. models/fused_ops.py falls back to eager ops for anything else.
//
// Matmuls: a few rows (decode) stream the weight once in `packed_linear`; more rows with int8 weights
// dequantize L2-sized tiles for oneDNN (`int8_linear_tiled`); `huge_page_copy` puts weights and the KV
// cache on 2 MB pages.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#endif

#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

using bf16 = c10::BFloat16;

inline float to_float(float v) { return v; }
inline float to_float(bf16 v) { return static_cast<float>(v); }
inline float to_float(int8_t v) { return static_cast<float>(v); }
// float -> T: the identity for float, round-to-nearest-even for bfloat16 (what torch's casts do).
template <typename T>
inline T from_float(float v) {
  return static_cast<T>(v);
}
// What a bfloat16 op rounds its float32 result to; the identity in float32.
template <typename T>
inline float rounded(float v) {
  return to_float(from_float<T>(v));
}

void check_activation(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu() && (t.scalar_type() == at::kFloat || t.scalar_type() == at::kBFloat16), name,
              " must be a float32 or bfloat16 CPU tensor, got ", t.scalar_type(), " on ", t.device());
}

// Calls fn(T{}) with T the C++ type of t's dtype: float or c10::BFloat16.
template <typename F>
void dispatch_activation(const at::Tensor& t, const char* name, F&& fn) {
  check_activation(t, name);
  if (t.scalar_type() == at::kFloat) {
    fn(float{});
  } else {
    fn(bf16{});
  }
}

void check_same_dtype(const at::Tensor& a, const at::Tensor& b, const char* what) {
  TORCH_CHECK(a.scalar_type() == b.scalar_type(), what, " must have the activations' dtype ",
              a.scalar_type(), ", got ", b.scalar_type());
}

// Work below this many floats per parallel task runs on the calling thread: waking the pool costs
// more than a small row's arithmetic.
constexpr int64_t kParallelGrainFloats = 1 << 15;

int64_t grain_for(int64_t floats_per_task) {
  return std::max<int64_t>(1, kParallelGrainFloats / std::max<int64_t>(1, floats_per_task));
}

// ---- Vectors ----------------------------------------------------------------------------------------
// Vector loads that widen each weight dtype to float32 lanes: bfloat16 is the top half of a float32
// (a shift), int8 a sign extension and a conversion; both happen in registers, so the weight is read
// from memory at its own width.
#if defined(__AVX512F__)
constexpr const char* kIsa = "avx512";
constexpr int kLanes = 16;
constexpr int kMaxRowGroup = 4;  // 4 x 4 accumulators + 4 weights + 1 input of 32 registers
using vfloat = __m512;
inline vfloat vzero() { return _mm512_setzero_ps(); }
inline vfloat vload(const float* p) { return _mm512_loadu_ps(p); }
inline vfloat vload(const bf16* p) {
  const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}
inline vfloat vload(const int8_t* p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}
inline vfloat vfma(vfloat a, vfloat b, vfloat c) { return _mm512_fmadd_ps(a, b, c); }
inline float vsum(vfloat v) { return _mm512_reduce_add_ps(v); }
inline vfloat vset(float v) { return _mm512_set1_ps(v); }
inline void vstore(float* p, vfloat v) { _mm512_storeu_ps(p, v); }
inline vfloat vmul(vfloat a, vfloat b) { return _mm512_mul_ps(a, b); }
inline vfloat vround(vfloat v) { return _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
inline vfloat vclamp(vfloat v, float lo, float hi) {
  return _mm512_min_ps(_mm512_max_ps(v, _mm512_set1_ps(lo)), _mm512_set1_ps(hi));
}
inline vfloat vpow2(vfloat n) {  // 2^n for whole n in [-126, 127]: the exponent field
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23));
}
#elif defined(__AVX2__) && defined(__FMA__)
constexpr const char* kIsa = "avx2";
constexpr int kLanes = 8;
constexpr int kMaxRowGroup = 2;  // 16 registers: 2 x 4 accumulators + 4 weights + 1 input
using vfloat = __m256;
inline vfloat vzero() { return _mm256_setzero_ps(); }
inline vfloat vload(const float* p) { return _mm256_loadu_ps(p); }
inline vfloat vload(const bf16* p) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(raw), 16));
}
inline vfloat vload(const int8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}
inline vfloat vfma(vfloat a, vfloat b, vfloat c) { return _mm256_fmadd_ps(a, b, c); }
inline vfloat vset(float v) { return _mm256_set1_ps(v); }
inline void vstore(float* p, vfloat v) { _mm256_storeu_ps(p, v); }
inline vfloat vmul(vfloat a, vfloat b) { return _mm256_mul_ps(a, b); }
inline vfloat vround(vfloat v) { return _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
inline vfloat vclamp(vfloat v, float lo, float hi) {
  return _mm256_min_ps(_mm256_max_ps(v, _mm256_set1_ps(lo)), _mm256_set1_ps(hi));
}
inline vfloat vpow2(vfloat n) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23));
}
inline float vsum(vfloat v) {
  __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  h = _mm_hadd_ps(h, h);
  return _mm_cvtss_f32(_mm_hadd_ps(h, h));
}
#else
constexpr const char* kIsa = "none";
constexpr int kLanes = 1;
constexpr int kMaxRowGroup = 1;
using vfloat = float;
inline vfloat vzero() { return 0.f; }
template <typename W>
inline vfloat vload(const W* p) {
  return to_float(*p);
}
inline vfloat vfma(vfloat a, vfloat b, vfloat c) { return a * b + c; }
inline float vsum(vfloat v) { return v; }
inline vfloat vset(float v) { return v; }
inline void vstore(float* p, vfloat v) { *p = v; }
inline vfloat vmul(vfloat a, vfloat b) { return a * b; }
#endif

#if defined(__AVX2__) && defined(__FMA__)
// exp(x) for x <= 0 (softmax after subtracting the peak): 2^n * e^r with n = round(x / ln 2) and r in
// [-ln 2 / 2, ln 2 / 2], e^r by Cephes' expf polynomial (~1 ulp). Clamped where 2^n stays normal.
inline vfloat vexp(vfloat x) {
  x = vclamp(x, -87.0f, 88.0f);
  const vfloat n = vround(vmul(x, vset(1.44269504088896341f)));
  vfloat r = vfma(n, vset(-0.693359375f), x);
  r = vfma(n, vset(2.12194440e-4f), r);
  vfloat p = vset(1.9875691500e-4f);
  for (const float c : {1.3981999507e-3f, 8.3334519073e-3f, 4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f}) {
    p = vfma(p, r, vset(c));
  }
  p = vfma(p, vmul(r, r), r);
  p = vfma(vset(1.f), vset(1.f), p);  // 1 + r + r^2 * poly(r)
  return vmul(p, vpow2(n));
}
#else
inline vfloat vexp(vfloat x) { return std::exp(x); }
#endif


// residual (when given) += x, then returns rms_norm(residual) * weight; without residual, of x.
// Same order of operations and roundings as transformers' LlamaRMSNorm: statistics in float32, the
// normalised row rounded to the model dtype before the weight multiplies it.
template <typename T>
void add_rms_norm_impl(const T* xp, T* res, const T* wp, T* op, int64_t rows, int64_t hidden, float eps) {
  at::parallel_for(0, rows, grain_for(hidden), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* xr = xp + r * hidden;
      T* src = res ? res + r * hidden : const_cast<T*>(xr);
      T* yr = op + r * hidden;
      float sum_sq = 0.f;
      if (res) {
#pragma omp simd reduction(+ : sum_sq)
        for (int64_t h = 0; h < hidden; ++h) {
          const T sum = from_float<T>(to_float(src[h]) + to_float(xr[h]));
          src[h] = sum;
          sum_sq += to_float(sum) * to_float(sum);
        }
      } else {
#pragma omp simd reduction(+ : sum_sq)
        for (int64_t h = 0; h < hidden; ++h) sum_sq += to_float(src[h]) * to_float(src[h]);
      }
      const float inv_rms = 1.f / std::sqrt(sum_sq / static_cast<float>(hidden) + eps);
#pragma omp simd
      for (int64_t h = 0; h < hidden; ++h) {
        yr[h] = from_float<T>(to_float(wp[h]) * rounded<T>(to_float(src[h]) * inv_rms));
      }
    }
  });
}

at::Tensor add_rms_norm(const at::Tensor& x, const std::optional<at::Tensor>& residual,
                        const at::Tensor& weight, double eps) {
  check_activation(x, "x");
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous(), "x must be contiguous [tokens, hidden]");
  check_same_dtype(x, weight, "weight");
  if (residual.has_value()) {
    TORCH_CHECK(residual->sizes() == x.sizes() && residual->is_contiguous(), "residual must match x");
    check_same_dtype(x, *residual, "residual");
  }
  auto out = at::empty_like(x);
  dispatch_activation(x, "x", [&](auto tag) {
    using T = decltype(tag);
    add_rms_norm_impl<T>(x.data_ptr<T>(), residual.has_value() ? residual->data_ptr<T>() : nullptr,
                         weight.data_ptr<T>(), out.data_ptr<T>(), x.size(0), x.size(1), static_cast<float>(eps));
  });
  return out;
}

// qkv [tokens, heads + 2 * kv_heads, head_dim]: rotates the query and key heads in place
// (x * cos + roll(x, head_dim / 2) * signed_sin, see fused_ops.apply_rope_; each product and the sum
// rounded like transformers' ops in bfloat16), then writes each token's keys and values to cache
// [2 * kv_heads, slots, head_dim] at its slot.
template <typename T>
void rope_and_cache_impl(T* qp, const T* cp, const T* sp, T* kvp, const int64_t* slot, int64_t tokens,
                         int64_t all_heads, int64_t dim, int64_t num_heads, int64_t cache_slots) {
  const int64_t half = dim / 2, two_kv = all_heads - num_heads;
  at::parallel_for(0, tokens, grain_for(all_heads * dim), [&](int64_t begin, int64_t end) {
    std::vector<T> rotated(dim);
    for (int64_t t = begin; t < end; ++t) {
      TORCH_CHECK(slot[t] >= 0 && slot[t] < cache_slots, "slot out of range");
      const T* c = cp + t * dim;
      const T* s = sp + t * dim;
      for (int64_t h = 0; h < num_heads + two_kv / 2; ++h) {
        T* x = qp + (t * all_heads + h) * dim;
        for (int64_t i = 0; i < dim; ++i) {
          const float a = rounded<T>(to_float(x[i]) * to_float(c[i]));
          const float b = rounded<T>(to_float(x[(i + half) % dim]) * to_float(s[i]));
          rotated[i] = from_float<T>(a + b);
        }
        std::copy(rotated.begin(), rotated.end(), x);
      }
      for (int64_t r = 0; r < two_kv; ++r) {
        const T* src = qp + (t * all_heads + num_heads + r) * dim;
        std::copy(src, src + dim, kvp + (r * cache_slots + slot[t]) * dim);
      }
    }
  });
}

void rope_and_cache(const at::Tensor& qkv, const at::Tensor& cos, const at::Tensor& signed_sin,
                    const at::Tensor& cache, const at::Tensor& slots, int64_t num_heads) {
  check_activation(qkv, "qkv");
  TORCH_CHECK(qkv.dim() == 3 && qkv.is_contiguous() && cache.is_contiguous(), "qkv and cache must be contiguous");
  TORCH_CHECK(cos.is_contiguous() && signed_sin.is_contiguous(), "rope tables must be contiguous");
  TORCH_CHECK(slots.scalar_type() == at::kLong, "slots must be int64");
  for (const auto* t : {&cos, &signed_sin, &cache}) check_same_dtype(qkv, *t, "rope tables and cache");
  const int64_t all_heads = qkv.size(1), dim = qkv.size(2);
  TORCH_CHECK(cache.size(0) == all_heads - num_heads && cache.size(2) == dim, "cache shape does not match qkv");
  dispatch_activation(qkv, "qkv", [&](auto tag) {
    using T = decltype(tag);
    rope_and_cache_impl<T>(qkv.data_ptr<T>(), cos.data_ptr<T>(), signed_sin.data_ptr<T>(), cache.data_ptr<T>(),
                           slots.data_ptr<int64_t>(), qkv.size(0), all_heads, dim, num_heads, cache.size(1));
  });
}

// dot(a, b) over n values, a float32, b float32 or bfloat16.
template <typename T>
inline float dot(const float* a, const T* b, int64_t n) {
  vfloat acc = vzero();
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) acc = vfma(vload(a + i), vload(b + i), acc);
  float sum = vsum(acc);
  for (; i < n; ++i) sum += a[i] * to_float(b[i]);
  return sum;
}

// acc[0..n) += p * v[0..n).
template <typename T>
inline void add_scaled(float* acc, float p, const T* v, int64_t n) {
  const vfloat pv = vset(p);
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) vstore(acc + i, vfma(pv, vload(v + i), vload(acc + i)));
  for (; i < n; ++i) acc[i] += p * to_float(v[i]);
}

// s[0..n) = exp(s - peak) in place; returns their sum.
inline float exp_shifted(float* s, int64_t n, float peak) {
  float total = 0.f;
  int64_t i = 0;
  const vfloat shift = vset(peak);
  for (; i + kLanes <= n; i += kLanes) {
    const vfloat e = vexp(vfma(vset(-1.f), shift, vload(s + i)));
    vstore(s + i, e);
    total += vsum(e);
  }
  for (; i < n; ++i) total += (s[i] = std::exp(s[i] - peak));
  return total;
}

// Asks for the cache lines of the next block while this one is computed: blocks sit anywhere in the
// cache, and the hardware prefetcher stops at each 4 KB page (a 16-token block of 64 float32 values).
template <typename T>
inline void prefetch_block(const T* base, const int64_t* table, int64_t next, int64_t num_blocks, int64_t block_floats) {
  if (next >= num_blocks) return;
  const char* p = reinterpret_cast<const char*>(base + table[next] * block_floats);
  const int64_t bytes = block_floats * static_cast<int64_t>(sizeof(T));
  for (int64_t off = 0; off < bytes; off += 64) __builtin_prefetch(p + off);
}

// One query token per sequence against its paged context: q [seqs, heads, head_dim] (any strides
// along the first two dims), block_tables [seqs, max_blocks], context_lens [seqs]; returns
// [seqs, heads, head_dim]. Keys and values are read in place from the cache, block by block; scores,
// softmax and the weighted sum in float32.
template <typename T>
void paged_decode_attention_impl(const at::Tensor& q, const T* kvp, const int64_t* tables, const int64_t* lens,
                                 T* op, int64_t kv_heads, int64_t cache_slots, int64_t max_blocks,
                                 int64_t block_size, float scale, int64_t longest) {
  const int64_t seqs = q.size(0), heads = q.size(1), dim = q.size(2), group = heads / kv_heads;
  const T* qp = q.data_ptr<T>();
  const int64_t q_seq = q.stride(0), q_head = q.stride(1);
  // A task is one (sequence, kv head): its query heads share every key and value read.
  at::parallel_for(0, seqs * kv_heads, grain_for(group * longest * dim * 2), [&](int64_t begin, int64_t end) {
    std::vector<float> scores, qf(group * dim), acc(group * dim);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t seq = task / kv_heads, kv_head = task % kv_heads, len = lens[seq];
      const T* keys = kvp + kv_head * cache_slots * dim;
      const T* values = kvp + (kv_heads + kv_head) * cache_slots * dim;
      const int64_t* table = tables + seq * max_blocks;
      for (int64_t g = 0; g < group; ++g) {
        const T* qv = qp + seq * q_seq + (kv_head * group + g) * q_head;
        for (int64_t i = 0; i < dim; ++i) qf[g * dim + i] = to_float(qv[i]);
      }
      scores.resize(group * len);
      // Block by block: a block's tokens are contiguous slots, so no division per token.
      const int64_t num_blocks = (len + block_size - 1) / block_size, block_floats = block_size * dim;
      for (int64_t start = 0; start < len; start += block_size) {
        const int64_t n = std::min(block_size, len - start);
        prefetch_block(keys, table, start / block_size + 1, num_blocks, block_floats);
        const T* k = keys + table[start / block_size] * block_size * dim;
        for (int64_t j = 0; j < n; ++j, k += dim) {
          for (int64_t g = 0; g < group; ++g) scores[g * len + start + j] = dot(qf.data() + g * dim, k, dim) * scale;
        }
      }
      for (int64_t g = 0; g < group; ++g) {
        float* s = scores.data() + g * len;
        const float norm = 1.f / exp_shifted(s, len, *std::max_element(s, s + len));
        for (int64_t t = 0; t < len; ++t) s[t] *= norm;
      }
      std::fill(acc.begin(), acc.end(), 0.f);
      for (int64_t start = 0; start < len; start += block_size) {
        const int64_t n = std::min(block_size, len - start);
        prefetch_block(values, table, start / block_size + 1, num_blocks, block_floats);
        const T* v = values + table[start / block_size] * block_size * dim;
        for (int64_t j = 0; j < n; ++j, v += dim) {
          for (int64_t g = 0; g < group; ++g) add_scaled(acc.data() + g * dim, scores[g * len + start + j], v, dim);
        }
      }
      for (int64_t g = 0; g < group; ++g) {
        T* o = op + (seq * heads + kv_head * group + g) * dim;
        for (int64_t i = 0; i < dim; ++i) o[i] = from_float<T>(acc[g * dim + i]);
      }
    }
  });
}

at::Tensor paged_decode_attention(const at::Tensor& q, const at::Tensor& cache, const at::Tensor& block_tables,
                                  const at::Tensor& context_lens, int64_t block_size, double scale) {
  check_activation(q, "q");
  TORCH_CHECK(q.dim() == 3 && q.stride(2) == 1, "q must be [seqs, heads, head_dim] with contiguous rows");
  TORCH_CHECK(cache.is_contiguous() && block_tables.is_contiguous() && context_lens.is_contiguous(),
              "cache, block_tables and context_lens must be contiguous");
  TORCH_CHECK(block_tables.scalar_type() == at::kLong && context_lens.scalar_type() == at::kLong,
              "block_tables and context_lens must be int64");
  check_same_dtype(q, cache, "cache");
  const int64_t seqs = q.size(0), heads = q.size(1), dim = q.size(2);
  const int64_t kv_heads = cache.size(0) / 2, max_blocks = block_tables.size(1);
  TORCH_CHECK(heads % kv_heads == 0, "query heads must be a multiple of kv heads");
  const int64_t* lens = context_lens.data_ptr<int64_t>();
  const int64_t longest = seqs ? *std::max_element(lens, lens + seqs) : 0;
  TORCH_CHECK(longest <= max_blocks * block_size, "context longer than its block table");
  auto out = at::empty({seqs, heads, dim}, q.options());
  dispatch_activation(q, "q", [&](auto tag) {
    using T = decltype(tag);
    paged_decode_attention_impl<T>(q, cache.data_ptr<T>(), block_tables.data_ptr<int64_t>(), lens,
                                   out.data_ptr<T>(), kv_heads, cache.size(1), max_blocks, block_size,
                                   static_cast<float>(scale), longest);
  });
  return out;
}

// gate_up [tokens, 2 * intermediate] -> silu(gate) * up, through ATen's vectorised kernels (each
// rounded to the model dtype, as transformers' act_fn(gate) * up).
at::Tensor silu_mul(const at::Tensor& gate_up) {
  const int64_t half = gate_up.size(-1) / 2;
  return at::silu(gate_up.narrow(-1, 0, half)).mul_(gate_up.narrow(-1, half, half));
}

// dots[a][i] = x row a . weight row r[i], for R rows of x (float32, `in` apart) and 4 weight rows.
template <int R, typename W>
inline void dot_rows(const float* x, int64_t in, const W* const r[4], float dots[][4]) {
  vfloat acc[R][4];
  for (int a = 0; a < R; ++a)
    for (int i = 0; i < 4; ++i) acc[a][i] = vzero();
  int64_t k = 0;
  for (; k + kLanes <= in; k += kLanes) {
    const vfloat w[4] = {vload(r[0] + k), vload(r[1] + k), vload(r[2] + k), vload(r[3] + k)};
    for (int a = 0; a < R; ++a) {
      const vfloat xv = vload(x + a * in + k);
      for (int i = 0; i < 4; ++i) acc[a][i] = vfma(w[i], xv, acc[a][i]);
    }
  }
  for (int a = 0; a < R; ++a) {
    for (int i = 0; i < 4; ++i) {
      dots[a][i] = vsum(acc[a][i]);
      for (int64_t t = k; t < in; ++t) dots[a][i] += to_float(r[i][t]) * x[a * in + t];
    }
  }
}

// x [rows, in] (float32) times a weight stored as row slices w [splits, width, in] (the checkpoint's
// [out, in] layout cut into one block of output rows per thread, see llama.Linear.pack_for_cpu), each
// output times its row's scale (int8 weights) plus bias. A few rows are bound by reading the weight
// once, and one sequential stream per core does not keep enough reads in flight to reach the memory
// bandwidth: each thread reads four far-apart rows of its slice at a time (four streams), and every
// row of x uses each weight vector while it is in a register.
template <typename X, typename W>
void streamed_linear_impl(const float* xp, const W* wp, const float* scales, const X* bias, X* op, int64_t rows,
                          int64_t in, int64_t splits, int64_t width) {
  const int64_t quarter = width / 4, out_features = splits * width;
  at::parallel_for(0, splits, 1, [&](int64_t begin, int64_t end) {
    for (int64_t s = begin; s < end; ++s) {
      const W* slice = wp + s * width * in;
      // Output row j of the slice, and j + quarter, j + 2 quarters, j + 3 quarters; then any rest.
      for (int64_t j = 0; j < quarter + width % 4; ++j) {
        const bool rest = j >= quarter;
        int64_t cols[4];
        for (int i = 0; i < 4; ++i) cols[i] = rest ? 4 * quarter + (j - quarter) : j + i * quarter;
        const W* r[4];
        for (int i = 0; i < 4; ++i) r[i] = slice + cols[i] * in;
        for (int64_t row = 0; row < rows; row += kMaxRowGroup) {
          const int group = static_cast<int>(std::min<int64_t>(kMaxRowGroup, rows - row));
          float dots[kMaxRowGroup][4];
          const float* x = xp + row * in;
          switch (group) {
            case 1: dot_rows<1>(x, in, r, dots); break;
#if defined(__AVX2__) && defined(__FMA__)
            case 2: dot_rows<2>(x, in, r, dots); break;
#endif
#if defined(__AVX512F__)
            case 3: dot_rows<3>(x, in, r, dots); break;
            case 4: dot_rows<4>(x, in, r, dots); break;
#endif
            default: TORCH_CHECK(false, "unreachable row group ", group);
          }
          for (int a = 0; a < group; ++a) {
            X* o = op + (row + a) * out_features + s * width;
            for (int i = 0; i < (rest ? 1 : 4); ++i) {
              const int64_t col = s * width + cols[i];
              const float y = dots[a][i] * (scales ? scales[col] : 1.f);
              // transformers' F.linear in bfloat16 rounds the product, then adds the bias.
              o[cols[i]] = bias ? from_float<X>(rounded<X>(y) + to_float(bias[col])) : from_float<X>(y);
            }
          }
        }
      }
    }
  });
}

// Checks a packed weight [splits, width, in] against x [rows, in] and its optional scales and bias.
void check_packed(const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& scales,
                  const std::optional<at::Tensor>& bias) {
  check_activation(x, "x");
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && w.dim() == 3 && w.is_contiguous(),
              "x [rows, in] and weight [splits, width, in] must be contiguous");
  TORCH_CHECK(w.device().is_cpu(), "weight must be a CPU tensor");
  TORCH_CHECK(w.size(2) == x.size(1), "weight has ", w.size(2), " inputs, x has ", x.size(1));
  const int64_t out_features = w.size(0) * w.size(1);
  if (w.scalar_type() == at::kChar) {
    TORCH_CHECK(scales.has_value() && scales->scalar_type() == at::kFloat && scales->is_contiguous() &&
                    scales->numel() == out_features,
                "int8 weights need float32 scales, one per output row (", out_features, ")");
  } else {
    TORCH_CHECK(!scales.has_value(), "scales are for int8 weights only");
    check_same_dtype(x, w, "weight");
  }
  if (bias.has_value()) {
    TORCH_CHECK(bias->is_contiguous() && bias->numel() == out_features, "bias must have one value per output");
    check_same_dtype(x, *bias, "bias");
  }
}

// Few-row product (decode): every weight element is read from memory once, at its own width.
at::Tensor packed_linear(const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& scales,
                         const std::optional<at::Tensor>& bias) {
  check_packed(x, w, scales, bias);
  const int64_t rows = x.size(0), in = x.size(1), splits = w.size(0), width = w.size(1);
  auto out = at::empty({rows, splits * width}, x.options());
  const at::Tensor xf = x.to(at::kFloat).contiguous();  // a few rows: widened once, not per weight row
  const float* sp = scales.has_value() ? scales->data_ptr<float>() : nullptr;
  dispatch_activation(x, "x", [&](auto xtag) {
    using X = decltype(xtag);
    const X* bp = bias.has_value() ? bias->data_ptr<X>() : nullptr;
    auto run = [&](auto wtag) {
      using W = decltype(wtag);
      streamed_linear_impl<X, W>(xf.data_ptr<float>(), reinterpret_cast<const W*>(w.data_ptr()), sp, bp,
                                 out.data_ptr<X>(), rows, in, splits, width);
    };
    if (w.scalar_type() == at::kChar) {
      run(int8_t{});
    } else if (w.scalar_type() == at::kBFloat16) {
      run(bf16{});
    } else {
      run(float{});
    }
  });
  return out;
}

// x [rows, in] times w [n, in]^T through oneDNN's linear (ATen's mkldnn::_linear_pointwise, which
// takes the plain [out, in] layout) where torch was built with it, else ATen's matmul (MKL). On this
// project's AMD machines oneDNN ran a [64, 512] x [512, 3072] float32 product 2.1x faster than MKL.
at::Tensor linear_rows(const at::Tensor& x, const at::Tensor& w) {
  static const std::optional<c10::OperatorHandle> onednn =
      c10::Dispatcher::singleton().findOp({"mkldnn::_linear_pointwise", ""});
  if (!onednn.has_value()) return at::mm(x, w.t());
  torch::jit::Stack stack{x, w, c10::IValue(), c10::IValue(std::string("none")),
                          c10::IValue(c10::List<std::optional<c10::Scalar>>()), c10::IValue()};
  onednn->callBoxed(&stack);
  return stack[0].toTensor();
}

// Many-row product (prefill, large decode batches) with int8 weights: each thread dequantizes a tile
// of its slice's rows (w * scale, in the activations' dtype) into a buffer the size of its L2 cache
// and multiplies the tile with `linear_rows` (single-threaded inside this parallel region). The
// weight is still read from memory at one byte per element; the dequantization is paid once per tile
// for all rows of x.
// dst[0..n) = q * scale, computed in float32 and rounded once to X.
template <typename X>
inline void dequantize_row(const int8_t* q, float scale, X* dst, int64_t n) {
#pragma omp simd
  for (int64_t k = 0; k < n; ++k) dst[k] = from_float<X>(static_cast<float>(q[k]) * scale);
}

// out = w * scales per row, for an int8 weight [..., in] with one scale per row: the whole weight
// widened for one multi-threaded matmul (prefill-sized products, see fused_ops.DEQUANTIZE_ROWS).
void dequantize_int8(const at::Tensor& w, const at::Tensor& scales, const at::Tensor& out) {
  TORCH_CHECK(w.scalar_type() == at::kChar && w.is_contiguous() && out.is_contiguous() && out.sizes() == w.sizes(),
              "dequantize_int8 takes a contiguous int8 weight and an output of its shape");
  const int64_t in = w.size(-1), rows = w.numel() / in;
  TORCH_CHECK(scales.scalar_type() == at::kFloat && scales.numel() == rows, "one float32 scale per row");
  const int8_t* wp = w.data_ptr<int8_t>();
  const float* sp = scales.data_ptr<float>();
  dispatch_activation(out, "out", [&](auto tag) {
    using X = decltype(tag);
    X* op = out.data_ptr<X>();
    at::parallel_for(0, rows, grain_for(in), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) dequantize_row(wp + r * in, sp[r], op + r * in, in);
    });
  });
}

constexpr int kTileFloatsLog2 = 18;  // 2^18 float32 values: 1 MB

at::Tensor int8_linear_tiled(const at::Tensor& x, const at::Tensor& w, const at::Tensor& scales,
                             const std::optional<at::Tensor>& bias) {
  check_packed(x, w, scales, bias);
  TORCH_CHECK(w.scalar_type() == at::kChar, "int8_linear_tiled takes int8 weights");
  const int64_t rows = x.size(0), in = x.size(1), splits = w.size(0), width = w.size(1);
  const int64_t out_features = splits * width;
  // Tiles of at most 1 MB of float32 (a core's L2 here), the slice cut evenly in 16-row steps: a short
  // last tile would cost a matmul call for little work. Against 256 KB tiles this took a decoder
  // layer's [64, in] products from 1.19x to 1.09x the float32 oneDNN time (bench-60m, 2 threads).
  const int64_t max_tile = std::max<int64_t>(16, (int64_t{1} << kTileFloatsLog2) / in);
  const int64_t tiles_per_split = (width + max_tile - 1) / max_tile;
  const int64_t tile = std::min(width, ((width + tiles_per_split - 1) / tiles_per_split + 15) / 16 * 16);
  auto out = at::empty({rows, out_features}, x.options());
  const int8_t* wp = w.data_ptr<int8_t>();
  const float* sp = scales.data_ptr<float>();
  dispatch_activation(x, "x", [&](auto xtag) {
    using X = decltype(xtag);
    at::parallel_for(0, splits * tiles_per_split, 1, [&](int64_t begin, int64_t end) {
      // Kept per thread across calls: a fresh megabyte each call came back from the allocator as new
      // pages, and faulting them in cost more than the dequantization.
      thread_local std::vector<char> scratch;
      scratch.resize(std::max(scratch.size(), static_cast<size_t>(tile * in) * sizeof(X)));
      X* bp = reinterpret_cast<X*>(scratch.data());
      const at::Tensor buffer = at::from_blob(bp, {tile, in}, x.options());
      for (int64_t task = begin; task < end; ++task) {
        const int64_t s = task / tiles_per_split, first = (task % tiles_per_split) * tile;
        const int64_t n = std::min(tile, width - first), col0 = s * width + first;
        if (n <= 0) continue;  // the rounding to 16 rows left this tile nothing
        for (int64_t j = 0; j < n; ++j) dequantize_row(wp + (col0 + j) * in, sp[col0 + j], bp + j * in, in);
        // Only the matmul is an ATen op: in-place ATen ops on the caller's tensors would not see its
        // inference mode from a pool thread.
        const at::Tensor y = linear_rows(x, buffer.narrow(0, 0, n)).contiguous();
        const X* yp = y.data_ptr<X>();
        const X* bias_p = bias.has_value() ? bias->data_ptr<X>() + col0 : nullptr;
        X* op = out.data_ptr<X>() + col0;
        for (int64_t row = 0; row < rows; ++row) {
          for (int64_t j = 0; j < n; ++j) {
            const X v = yp[row * n + j];
            op[row * out_features + j] = bias_p ? from_float<X>(to_float(v) + to_float(bias_p[j])) : v;
          }
        }
      }
    });
  });
  return out;
}

// One decoder layer for a decode step of at most a few sequences, the ops above in the order
// llama.LlamaForCausalLM.forward runs them: one call per layer instead of nine from Python (~5 us of
// interpreter and dispatch each, a tenth of an int8 batch-1 step on bench-60m). x [seqs, hidden];
// the residual stream is updated in place (x itself when there is none yet, the first layer); the
// weights are packed row blocks (weight, bias, scales as llama.LinearWeights holds them). Returns this
// layer's MLP output.
at::Tensor decode_layer(
    const at::Tensor& x, const std::optional<at::Tensor>& residual, const at::Tensor& input_norm,
    const at::Tensor& post_norm, double eps, const at::Tensor& qkv_w, const std::optional<at::Tensor>& qkv_b,
    const std::optional<at::Tensor>& qkv_s, const at::Tensor& o_w, const std::optional<at::Tensor>& o_b,
    const std::optional<at::Tensor>& o_s, const at::Tensor& gate_up_w, const std::optional<at::Tensor>& gate_up_b,
    const std::optional<at::Tensor>& gate_up_s, const at::Tensor& down_w, const std::optional<at::Tensor>& down_b,
    const std::optional<at::Tensor>& down_s, const at::Tensor& cos, const at::Tensor& signed_sin,
    const at::Tensor& cache, const at::Tensor& slots, const at::Tensor& block_tables, const at::Tensor& context_lens,
    int64_t block_size, int64_t num_heads, double scale) {
  const int64_t seqs = x.size(0), head_dim = cache.size(2);
  const at::Tensor stream = residual.has_value() ? *residual : x;
  const at::Tensor h = add_rms_norm(x, residual, input_norm, eps);
  const at::Tensor qkv = packed_linear(h, qkv_w, qkv_s, qkv_b).view({seqs, -1, head_dim});
  rope_and_cache(qkv, cos, signed_sin, cache, slots, num_heads);
  const at::Tensor attn =
      paged_decode_attention(qkv.narrow(1, 0, num_heads), cache, block_tables, context_lens, block_size, scale);
  const at::Tensor o = packed_linear(attn.view({seqs, -1}), o_w, o_s, o_b);
  const at::Tensor h2 = add_rms_norm(o, stream, post_norm, eps);
  const at::Tensor out = packed_linear(silu_mul(packed_linear(h2, gate_up_w, gate_up_s, gate_up_b)), down_w, down_s, down_b);
  return out;
}

// A copy of t in memory the kernel is asked to back with 2 MB pages (transparent huge pages, which
// Linux gives on request by default). The KV cache's blocks sit anywhere in it, one 4 KB page per
// block and head: on 4 KB pages a 64-sequence decode step spent more time in TLB misses than in
// arithmetic (8.7 ms against 3.2 ms over the same blocks laid out in order). Weights stream faster
// too, as the hardware prefetcher stops at each page boundary.
at::Tensor huge_page_copy(const at::Tensor& t) {
  TORCH_CHECK(t.device().is_cpu(), "huge pages are for CPU tensors");
  constexpr size_t kHugePage = size_t{2} << 20;
  const size_t bytes = static_cast<size_t>(t.numel()) * t.element_size();
  const size_t size = std::max(kHugePage, (bytes + kHugePage - 1) / kHugePage * kHugePage);
  void* memory = std::aligned_alloc(kHugePage, size);
  TORCH_CHECK(memory != nullptr, "cannot allocate ", size, " bytes");
  madvise(memory, size, MADV_HUGEPAGE);  // advice only: without THP the memory is ordinary pages
  at::Tensor out = at::from_blob(memory, t.sizes(), [](void* m) { std::free(m); }, t.options());
  out.copy_(t);
  return out;
}

std::string cpu_isa() { return kIsa; }

}  // namespace

TORCH_LIBRARY(kubeinfer, m) {
  m.def("add_rms_norm(Tensor x, Tensor(a!)? residual, Tensor weight, float eps) -> Tensor", &add_rms_norm);
  m.def("rope_and_cache(Tensor(a!) qkv, Tensor cos, Tensor signed_sin, Tensor(b!) cache, Tensor slots, "
        "int num_heads) -> ()",
        &rope_and_cache);
  m.def("paged_decode_attention(Tensor q, Tensor cache, Tensor block_tables, Tensor context_lens, "
        "int block_size, float scale) -> Tensor",
        &paged_decode_attention);
  m.def("silu_mul(Tensor gate_up) -> Tensor", &silu_mul);
  m.def("packed_linear(Tensor x, Tensor w, Tensor? scales, Tensor? bias) -> Tensor", &packed_linear);
  m.def("int8_linear_tiled(Tensor x, Tensor w, Tensor scales, Tensor? bias) -> Tensor", &int8_linear_tiled);
  m.def("cpu_isa() -> str", &cpu_isa);
  m.def("huge_page_copy(Tensor t) -> Tensor", &huge_page_copy);
  m.def("dequantize_int8(Tensor w, Tensor scales, Tensor(a!) out) -> ()", &dequantize_int8);
  m.def("decode_layer(Tensor(c!) x, Tensor(a!)? residual, Tensor input_norm, Tensor post_norm, float eps, "
        "Tensor qkv_w, Tensor? qkv_b, Tensor? qkv_s, Tensor o_w, Tensor? o_b, Tensor? o_s, "
        "Tensor gate_up_w, Tensor? gate_up_b, Tensor? gate_up_s, Tensor down_w, Tensor? down_b, Tensor? down_s, "
        "Tensor cos, Tensor signed_sin, Tensor(b!) cache, Tensor slots, Tensor block_tables, Tensor context_lens, "
        "int block_size, int num_heads, float scale) -> Tensor",
        &decode_layer);
}
