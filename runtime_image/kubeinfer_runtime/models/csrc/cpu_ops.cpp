// CPU kernels for the decode path: what eager PyTorch spends ~40 small ops per layer on.
//
// A batch-1 decode step on a small model is bound by memory bandwidth in its matmuls; every other op
// costs a few microseconds of dispatch for almost no arithmetic. These kernels fold that glue into
// four calls per layer: residual add + RMSNorm, rotary embedding + KV-cache write, attention over the
// paged cache (no gather copy, every decode sequence in one call), and SiLU-and-multiply.
// float32 only; the Python side (models/fused.py) falls back to eager ops for anything else.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <vector>

namespace {

void check_float_cpu(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == at::kFloat, name, " must be a float32 CPU tensor");
}

// Work below this many floats per parallel task runs on the calling thread: waking the pool costs
// more than a small row's arithmetic.
constexpr int64_t kParallelGrainFloats = 1 << 15;

int64_t grain_for(int64_t floats_per_task) {
  return std::max<int64_t>(1, kParallelGrainFloats / std::max<int64_t>(1, floats_per_task));
}

// residual (when given) += x, then returns rms_norm(residual) * weight; without residual, of x.
// Same order of operations as transformers' LlamaRMSNorm in float32.
at::Tensor add_rms_norm(const at::Tensor& x, const std::optional<at::Tensor>& residual,
                        const at::Tensor& weight, double eps) {
  check_float_cpu(x, "x");
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous(), "x must be contiguous [tokens, hidden]");
  const int64_t rows = x.size(0), hidden = x.size(1);
  float* res = nullptr;
  if (residual.has_value()) {
    TORCH_CHECK(residual->sizes() == x.sizes() && residual->is_contiguous(), "residual must match x");
    res = residual->data_ptr<float>();
  }
  auto out = at::empty_like(x);
  const float* xp = x.data_ptr<float>();
  const float* wp = weight.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const auto feps = static_cast<float>(eps);
  at::parallel_for(0, rows, grain_for(hidden), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* xr = xp + r * hidden;
      float* src = res ? res + r * hidden : const_cast<float*>(xr);
      float* yr = op + r * hidden;
      float sum_sq = 0.f;
      if (res) {
#pragma omp simd reduction(+ : sum_sq)
        for (int64_t h = 0; h < hidden; ++h) {
          src[h] += xr[h];
          sum_sq += src[h] * src[h];
        }
      } else {
#pragma omp simd reduction(+ : sum_sq)
        for (int64_t h = 0; h < hidden; ++h) sum_sq += src[h] * src[h];
      }
      const float inv_rms = 1.f / std::sqrt(sum_sq / static_cast<float>(hidden) + feps);
#pragma omp simd
      for (int64_t h = 0; h < hidden; ++h) yr[h] = wp[h] * (src[h] * inv_rms);
    }
  });
  return out;
}

// qkv [tokens, heads + 2 * kv_heads, head_dim]: rotates the query and key heads in place
// (x * cos + roll(x, head_dim / 2) * signed_sin, see attention.apply_rope_), then writes each token's
// keys and values to cache [2 * kv_heads, slots, head_dim] at its slot.
void rope_and_cache(const at::Tensor& qkv, const at::Tensor& cos, const at::Tensor& signed_sin,
                    const at::Tensor& cache, const at::Tensor& slots, int64_t num_heads) {
  check_float_cpu(qkv, "qkv");
  check_float_cpu(cache, "cache");
  TORCH_CHECK(qkv.dim() == 3 && qkv.is_contiguous() && cache.is_contiguous(), "qkv and cache must be contiguous");
  TORCH_CHECK(cos.is_contiguous() && signed_sin.is_contiguous(), "rope tables must be contiguous");
  TORCH_CHECK(slots.scalar_type() == at::kLong, "slots must be int64");
  const int64_t tokens = qkv.size(0), all_heads = qkv.size(1), dim = qkv.size(2), half = dim / 2;
  const int64_t two_kv = all_heads - num_heads, cache_slots = cache.size(1);
  TORCH_CHECK(cache.size(0) == two_kv && cache.size(2) == dim, "cache shape does not match qkv");
  float* qp = qkv.data_ptr<float>();
  const float* cp = cos.data_ptr<float>();
  const float* sp = signed_sin.data_ptr<float>();
  float* kvp = cache.data_ptr<float>();
  const int64_t* slot = slots.data_ptr<int64_t>();
  at::parallel_for(0, tokens, grain_for(all_heads * dim), [&](int64_t begin, int64_t end) {
    std::vector<float> rotated(dim);
    for (int64_t t = begin; t < end; ++t) {
      TORCH_CHECK(slot[t] >= 0 && slot[t] < cache_slots, "slot out of range");
      const float* c = cp + t * dim;
      const float* s = sp + t * dim;
      for (int64_t h = 0; h < num_heads + two_kv / 2; ++h) {
        float* x = qp + (t * all_heads + h) * dim;
        for (int64_t i = 0; i < dim; ++i) rotated[i] = x[i] * c[i] + x[(i + half) % dim] * s[i];
        std::copy(rotated.begin(), rotated.end(), x);
      }
      for (int64_t r = 0; r < two_kv; ++r) {
        const float* src = qp + (t * all_heads + num_heads + r) * dim;
        std::copy(src, src + dim, kvp + (r * cache_slots + slot[t]) * dim);
      }
    }
  });
}

// One query token per sequence against its paged context: q [seqs, heads, head_dim] (any strides
// along the first two dims), block_tables [seqs, max_blocks], context_lens [seqs]; returns
// [seqs, heads, head_dim]. Keys and values are read in place from the cache, block by block.
at::Tensor paged_decode_attention(const at::Tensor& q, const at::Tensor& cache, const at::Tensor& block_tables,
                                  const at::Tensor& context_lens, int64_t block_size, double scale) {
  check_float_cpu(q, "q");
  check_float_cpu(cache, "cache");
  TORCH_CHECK(q.dim() == 3 && q.stride(2) == 1, "q must be [seqs, heads, head_dim] with contiguous rows");
  TORCH_CHECK(cache.is_contiguous() && block_tables.is_contiguous() && context_lens.is_contiguous(),
              "cache, block_tables and context_lens must be contiguous");
  TORCH_CHECK(block_tables.scalar_type() == at::kLong && context_lens.scalar_type() == at::kLong,
              "block_tables and context_lens must be int64");
  const int64_t seqs = q.size(0), heads = q.size(1), dim = q.size(2);
  const int64_t kv_heads = cache.size(0) / 2, cache_slots = cache.size(1), max_blocks = block_tables.size(1);
  TORCH_CHECK(heads % kv_heads == 0, "query heads must be a multiple of kv heads");
  const int64_t group = heads / kv_heads;
  auto out = at::empty({seqs, heads, dim}, q.options());
  const float* qp = q.data_ptr<float>();
  const float* kvp = cache.data_ptr<float>();
  const int64_t* tables = block_tables.data_ptr<int64_t>();
  const int64_t* lens = context_lens.data_ptr<int64_t>();
  float* op = out.data_ptr<float>();
  const auto fscale = static_cast<float>(scale);
  const int64_t longest = seqs ? *std::max_element(lens, lens + seqs) : 0;
  TORCH_CHECK(longest <= max_blocks * block_size, "context longer than its block table");
  // A task is one (sequence, kv head): its query heads share every key and value read.
  at::parallel_for(0, seqs * kv_heads, grain_for(group * longest * dim * 2), [&](int64_t begin, int64_t end) {
    std::vector<float> scores;
    for (int64_t task = begin; task < end; ++task) {
      const int64_t seq = task / kv_heads, kv_head = task % kv_heads, len = lens[seq];
      const float* keys = kvp + kv_head * cache_slots * dim;
      const float* values = kvp + (kv_heads + kv_head) * cache_slots * dim;
      scores.assign(group * len, 0.f);
      for (int64_t t = 0; t < len; ++t) {
        const int64_t block = tables[seq * max_blocks + t / block_size];
        const float* k = keys + (block * block_size + t % block_size) * dim;
        for (int64_t g = 0; g < group; ++g) {
          const float* qv = qp + seq * q.stride(0) + (kv_head * group + g) * q.stride(1);
          float dot = 0.f;
#pragma omp simd reduction(+ : dot)
          for (int64_t i = 0; i < dim; ++i) dot += qv[i] * k[i];
          scores[g * len + t] = dot * fscale;
        }
      }
      for (int64_t g = 0; g < group; ++g) {
        float* s = scores.data() + g * len;
        const float peak = *std::max_element(s, s + len);
        float total = 0.f;
        for (int64_t t = 0; t < len; ++t) total += (s[t] = std::exp(s[t] - peak));
        const float norm = 1.f / total;
        float* o = op + (seq * heads + kv_head * group + g) * dim;
        std::fill(o, o + dim, 0.f);
        for (int64_t t = 0; t < len; ++t) {
          const int64_t block = tables[seq * max_blocks + t / block_size];
          const float* v = values + (block * block_size + t % block_size) * dim;
          const float p = s[t] * norm;
#pragma omp simd
          for (int64_t i = 0; i < dim; ++i) o[i] += p * v[i];
        }
      }
    }
  });
  return out;
}

// gate_up [tokens, 2 * intermediate] -> silu(gate) * up, through ATen's vectorised kernels.
at::Tensor silu_mul(const at::Tensor& gate_up) {
  const int64_t half = gate_up.size(-1) / 2;
  return at::silu(gate_up.narrow(-1, 0, half)).mul_(gate_up.narrow(-1, half, half));
}

#if defined(__AVX2__) && defined(__FMA__)
// Four dot products of one row of x against weight rows r[0..3], 8 floats at a time.
inline void dot4(const float* x, const float* const r[4], int64_t n, float out[4]) {
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
  int64_t k = 0;
  for (; k + 8 <= n; k += 8) {
    const __m256 xv = _mm256_loadu_ps(x + k);
    for (int i = 0; i < 4; ++i) acc[i] = _mm256_fmadd_ps(_mm256_loadu_ps(r[i] + k), xv, acc[i]);
  }
  for (int i = 0; i < 4; ++i) {
    __m128 v = _mm_add_ps(_mm256_castps256_ps128(acc[i]), _mm256_extractf128_ps(acc[i], 1));
    v = _mm_hadd_ps(v, v);
    out[i] = _mm_cvtss_f32(_mm_hadd_ps(v, v));
    for (int64_t t = k; t < n; ++t) out[i] += r[i][t] * x[t];
  }
}

// x [rows, in] times a weight stored as row slices w [splits, out / splits, in] (the checkpoint's
// [out, in] layout cut into one block of output rows per thread, see llama.Linear.pack_for_cpu).
// A few rows are bound by reading the weight once, and one sequential stream per core does not keep
// enough reads in flight to reach the memory bandwidth: each thread reads four far-apart rows of its
// slice at a time (four streams). On this project's 2-core machines that took ~30% off MKL's time
// over a decoder layer's matrices.
// Registered only where AVX2 and FMA are compiled in; fused_ops sends more rows, and every product
// elsewhere, to MKL.
at::Tensor packed_linear(const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& bias) {
  check_float_cpu(x, "x");
  check_float_cpu(w, "weight");
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && w.is_contiguous(), "x and weight must be contiguous");
  const int64_t rows = x.size(0), in = x.size(1), splits = w.size(0), width = w.size(1);
  TORCH_CHECK(w.size(2) == in, "weight has ", w.size(2), " inputs, x has ", in);
  auto out = at::empty({rows, splits * width}, x.options());
  const float* xp = x.data_ptr<float>();
  const float* wp = w.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const float* bp = bias.has_value() ? bias->data_ptr<float>() : nullptr;
  const int64_t quarter = width / 4;
  at::parallel_for(0, splits, 1, [&](int64_t begin, int64_t end) {
    for (int64_t s = begin; s < end; ++s) {
      const float* slice = wp + s * width * in;
      // Output row j of the slice, and j + quarter, j + 2 quarters, j + 3 quarters; then any rest.
      for (int64_t j = 0; j < quarter + width % 4; ++j) {
        const bool rest = j >= quarter;
        const int64_t first = rest ? 4 * quarter + (j - quarter) : j;
        const float* r[4];
        for (int i = 0; i < 4; ++i) r[i] = slice + (rest ? first : j + i * quarter) * in;
        for (int64_t row = 0; row < rows; ++row) {
          float dots[4];
          dot4(xp + row * in, r, in, dots);
          float* o = op + row * splits * width + s * width;
          for (int i = 0; i < (rest ? 1 : 4); ++i) {
            const int64_t col = rest ? first : j + i * quarter;
            o[col] = dots[i] + (bp ? bp[s * width + col] : 0.f);
          }
        }
      }
    }
  });
  return out;
}
#endif

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
#if defined(__AVX2__) && defined(__FMA__)
  m.def("packed_linear(Tensor x, Tensor w, Tensor? bias) -> Tensor", &packed_linear);
#endif
}
