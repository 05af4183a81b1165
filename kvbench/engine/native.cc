// kvbench's native CPU kernels. The few-row linear: y[m, n] = sum_k x[m, k] * w[n, k] (+ b[n]) for a handful of rows of x.
//
// Built and loaded by kvbench/engine/native.py (see its docstring for why and the numbers).
// The weight stays where nn.Linear keeps it (row-major, out_features x in_features): a tile of
// NB rows of w is held against MB rows of x in NB * MB vector accumulators, so each weight byte
// is read from memory once per call whatever the number of rows, and the next tiles' rows are
// prefetched while the first rows of x are multiplied. Every output is summed in the same order
// (lanes over k, then the lanes) whatever M, the tile or the thread count, so a row's result
// does not depend on the rows batched with it.

#include <stdint.h>
#include <immintrin.h>

#if defined(__AVX512F__)
typedef __m512 V;
static constexpr int LANES = 16;
static const char ISA[] = "avx512";
static inline V vzero() { return _mm512_setzero_ps(); }
static inline V vload(const float* p) { return _mm512_loadu_ps(p); }
static inline V vload_first(const float* p, int n) { return _mm512_maskz_loadu_ps((__mmask16)((1u << n) - 1), p); }
static inline V vfma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
static inline float vsum(V v) { return _mm512_reduce_add_ps(v); }
static inline V vset(float x) { return _mm512_set1_ps(x); }
static inline V vmax(V a, V b) { return _mm512_max_ps(a, b); }
static inline V vround(V x) { return _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
static inline V vpow2(V p, V n) { return _mm512_scalef_ps(p, n); }  // p * 2^n
static inline void vstore(float* p, V v) { _mm512_storeu_ps(p, v); }
#elif defined(__AVX2__) && defined(__FMA__)
typedef __m256 V;
static constexpr int LANES = 8;
static const char ISA[] = "avx2";
static inline V vzero() { return _mm256_setzero_ps(); }
static inline V vload(const float* p) { return _mm256_loadu_ps(p); }
static inline V vload_first(const float* p, int n) {
  __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  return _mm256_maskload_ps(p, mask);
}
static inline V vfma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
static inline V vset(float x) { return _mm256_set1_ps(x); }
static inline V vmax(V a, V b) { return _mm256_max_ps(a, b); }
static inline V vround(V x) { return _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
static inline V vpow2(V p, V n) {  // p * 2^n, n integral in [-126, 127]
  __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
}
static inline void vstore(float* p, V v) { _mm256_storeu_ps(p, v); }
static inline float vsum(V v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}
#else
#error "kvbench's few-row linear needs AVX-512 or AVX2 with FMA"
#endif

static constexpr int NB = 4;        // rows of w per tile
static constexpr int PREFETCH = 8;  // rows of w ahead that the first rows of x prefetch

template <int MB, bool FETCH>
static inline void tile(const float* x, const float* w, const float* b, float* y, int64_t N, int64_t K, int64_t n) {
  V acc[NB][MB];
  for (int j = 0; j < NB; ++j)
    for (int i = 0; i < MB; ++i) acc[j][i] = vzero();
  const int64_t whole = K - K % LANES;
  for (int64_t k = 0; k < whole; k += LANES) {
    V wv[NB];
    for (int j = 0; j < NB; ++j) wv[j] = vload(w + (n + j) * K + k);
    if (FETCH)
      for (int j = 0; j < NB; ++j) _mm_prefetch((const char*)(w + (n + j + PREFETCH) * K + k), _MM_HINT_T0);
    for (int i = 0; i < MB; ++i) {
      V xv = vload(x + i * K + k);
      for (int j = 0; j < NB; ++j) acc[j][i] = vfma(wv[j], xv, acc[j][i]);
    }
  }
  if (whole < K) {
    const int rest = (int)(K - whole);
    V wv[NB];
    for (int j = 0; j < NB; ++j) wv[j] = vload_first(w + (n + j) * K + whole, rest);
    for (int i = 0; i < MB; ++i) {
      V xv = vload_first(x + i * K + whole, rest);
      for (int j = 0; j < NB; ++j) acc[j][i] = vfma(wv[j], xv, acc[j][i]);
    }
  }
  for (int i = 0; i < MB; ++i)
    for (int j = 0; j < NB; ++j) y[i * N + n + j] = vsum(acc[j][i]) + (b ? b[n + j] : 0.0f);
}

// One output row n of w against one row of x, in the same order as tile().
static inline float dot(const float* x, const float* w, int64_t K) {
  V acc = vzero();
  const int64_t whole = K - K % LANES;
  for (int64_t k = 0; k < whole; k += LANES) acc = vfma(vload(w + k), vload(x + k), acc);
  if (whole < K) acc = vfma(vload_first(w + whole, (int)(K - whole)), vload_first(x + whole, (int)(K - whole)), acc);
  return vsum(acc);
}

template <int MB>
static inline void rows_of_x(const float* x, const float* w, const float* b, float* y, int64_t N, int64_t K,
                             int64_t n, bool first) {
  if (first) tile<MB, true>(x, w, b, y, N, K, n);
  else tile<MB, false>(x, w, b, y, N, K, n);
}

// Outputs [n0, n1) of every row of x.
static void outputs(const float* x, const float* w, const float* b, float* y, int64_t M, int64_t N, int64_t K,
                    int64_t n0, int64_t n1) {
  int64_t n = n0;
  for (; n + NB <= n1; n += NB) {
    // no use fetching past the end of w (a prefetch never faults): only tiles well inside fetch
    const bool fetch = n + NB + PREFETCH <= N;
    int64_t m = 0;
    for (; m + 4 <= M; m += 4) rows_of_x<4>(x + m * K, w, b, y + m * N, N, K, n, fetch && m == 0);
    if (m + 2 <= M) { rows_of_x<2>(x + m * K, w, b, y + m * N, N, K, n, fetch && m == 0); m += 2; }
    if (m < M) rows_of_x<1>(x + m * K, w, b, y + m * N, N, K, n, fetch && m == 0);
  }
  for (; n < n1; ++n)
    for (int64_t m = 0; m < M; ++m) y[m * N + n] = dot(x + m * K, w + n * K, K) + (b ? b[n] : 0.0f);
}

extern "C" const char* kvb_native_isa() { return ISA; }

// x: M x K, w: N x K, b: N or NULL, y: M x N, all fp32, contiguous, row-major.
extern "C" void kvb_few_rows_linear(const float* x, const float* w, const float* b, float* y, int64_t M, int64_t N,
                                    int64_t K, int threads) {
  if (threads <= 1 || N < 2 * NB * threads) {
    outputs(x, w, b, y, M, N, K, 0, N);
    return;
  }
  const int64_t share = ((N + threads - 1) / threads + NB - 1) / NB * NB;
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int t = 0; t < threads; ++t) {
    const int64_t n0 = t * share, n1 = n0 + share < N ? n0 + share : N;
    if (n0 < n1) outputs(x, w, b, y, M, N, K, n0, n1);
  }
}

// ---------------------------------------------------------------- paged decode attention
//
// One query token per sequence against its context, read in place from the KV pool's blocks
// (kvbench/engine/paged/kv_pool.py: each layer's keys and values are (kv_heads, pages,
// block_size, head_dim), contiguous). Softmax in fp32 over the whole context with the maximum
// subtracted (two passes over the scores: no online rescaling), exp by vexp() below.

#include <math.h>
#include <vector>

// exp(x) for x <= 0 (scores minus their maximum), LANES at a time: x = n ln2 + r with |r| <= ln2/2,
// exp(r) by its Taylor series to r^7 (relative error < 2e-8, below fp32's 6e-8 rounding), times 2^n.
// Below -87 (exp < 2^-126) the result is flushed to 2^-126 * exp(r), negligible beside the maximum's 1.
static inline V vexp(V x) {
  x = vmax(vset(-87.0f), x);  // x second: a NaN stays NaN (maxps returns its second operand then)
  const V n = vround(vfma(x, vset(1.44269504088896341f), vzero()));
  V r = vfma(n, vset(-0.693145751953125f), x);  // ln 2 in two parts (Cody and Waite)
  r = vfma(n, vset(-1.428606765330187e-06f), r);
  V p = vset(1.0f / 5040);
  p = vfma(p, r, vset(1.0f / 720));
  p = vfma(p, r, vset(1.0f / 120));
  p = vfma(p, r, vset(1.0f / 24));
  p = vfma(p, r, vset(1.0f / 6));
  p = vfma(p, r, vset(0.5f));
  p = vfma(p, r, vset(1.0f));
  p = vfma(p, r, vset(1.0f));
  return vpow2(p, n);
}

// The blocks of a sequence lie anywhere in the pool: while one block is read, the same row of
// the next one is fetched, so the hardware prefetcher's stream never starts cold.
static inline void fetch_row(const float* row, int64_t D) {
  for (int64_t d = 0; d < D; d += 16) _mm_prefetch((const char*)(row + d), _MM_HINT_T0);
}

// The row of token `offset` of block `slot` in the table: keys or values of kv head `kv_head`.
static inline const float* token_row(const float* pool, const int32_t* table, int64_t slot, int64_t offset,
                                     int64_t kv_head, int64_t pages, int64_t block_size, int64_t D) {
  return pool + ((kv_head * pages + table[slot]) * block_size + offset) * D;
}

static void attend_one(const float* q, const float* keys, const float* values, const int32_t* table, int64_t length,
                       float* out, int64_t group, int64_t pages, int64_t block_size, int64_t D, int64_t kv_head,
                       float scale, std::vector<float>& scores) {
  scores.resize((size_t)(group * length));
  const int64_t whole = D - D % LANES;
  const int rest = (int)(D - whole);
  const int64_t num_blocks = (length + block_size - 1) / block_size;
  for (int64_t b = 0, t = 0; b < num_blocks; ++b) {  // block by block: no division per token
    const int64_t in_block = length - t < block_size ? length - t : block_size;
    for (int64_t offset = 0; offset < in_block; ++offset, ++t) {
      const float* k = token_row(keys, table, b, offset, kv_head, pages, block_size, D);
      if (b + 1 < num_blocks) fetch_row(token_row(keys, table, b + 1, offset, kv_head, pages, block_size, D), D);
      for (int64_t g = 0; g < group; ++g) {
        const float* qg = q + g * D;
        V acc = vzero();
        for (int64_t d = 0; d < whole; d += LANES) acc = vfma(vload(qg + d), vload(k + d), acc);
        if (rest) acc = vfma(vload_first(qg + whole, rest), vload_first(k + whole, rest), acc);
        scores[g * length + t] = vsum(acc) * scale;
      }
    }
  }
  for (int64_t g = 0; g < group; ++g) {
    float* s = scores.data() + g * length;
    float top = -INFINITY, total = 0.0f;
    for (int64_t t = 0; t < length; ++t) top = s[t] > top ? s[t] : top;
    const int64_t whole_t = length - length % LANES;
    V sums = vzero();
    for (int64_t t = 0; t < whole_t; t += LANES) {
      const V e = vexp(vfma(vload(s + t), vset(1.0f), vset(-top)));
      vstore(s + t, e);
      sums = vfma(e, vset(1.0f), sums);
    }
    total = vsum(sums);
    for (int64_t t = whole_t; t < length; ++t) { s[t] = expf(s[t] - top); total += s[t]; }
    const float inverse = 1.0f / total;
    for (int64_t t = 0; t < length; ++t) s[t] *= inverse;
  }
  for (int64_t g = 0; g < group; ++g)
    for (int64_t d = 0; d < D; ++d) out[g * D + d] = 0.0f;
  for (int64_t b = 0, t = 0; b < num_blocks; ++b) {
    const int64_t in_block = length - t < block_size ? length - t : block_size;
    for (int64_t offset = 0; offset < in_block; ++offset, ++t) {
      const float* v = token_row(values, table, b, offset, kv_head, pages, block_size, D);
      if (b + 1 < num_blocks) fetch_row(token_row(values, table, b + 1, offset, kv_head, pages, block_size, D), D);
      for (int64_t g = 0; g < group; ++g) {
        const float p = scores[g * length + t];
        float* o = out + g * D;
        for (int64_t d = 0; d < D; ++d) o[d] += p * v[d];
      }
    }
  }
}

// q, out: (n, heads, D); tables: (n, width) int32, padded; lengths: (n,) int32, each >= 1.
extern "C" void kvb_paged_decode(const float* q, const float* keys, const float* values, const int32_t* tables,
                                 const int32_t* lengths, float* out, int64_t n, int64_t heads, int64_t kv_heads,
                                 int64_t pages, int64_t block_size, int64_t D, int64_t width, float scale,
                                 int threads) {
  const int64_t group = heads / kv_heads, items = n * kv_heads;
#pragma omp parallel num_threads(threads > 1 ? threads : 1) if (threads > 1)
  {
    std::vector<float> scores;
#pragma omp for schedule(dynamic, 1)
    for (int64_t item = 0; item < items; ++item) {
      const int64_t s = item / kv_heads, h = item % kv_heads;
      const int64_t first_head = h * group;  // query heads h*group .. grouped on kv head h (transformers' repeat_kv order)
      attend_one(q + (s * heads + first_head) * D, keys, values, tables + s * width, lengths[s],
                 out + (s * heads + first_head) * D, group, pages, block_size, D, h, scale, scores);
    }
  }
}
