// kvbench's few-row linear: y[m, n] = sum_k x[m, k] * w[n, k] (+ b[n]) for a handful of rows of x.
//
// Built and loaded by kvbench/engine/few_rows.py (see its docstring for why and the numbers).
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
    // prefetching past the end of w would touch memory that is not ours: only tiles well inside fetch
    const bool fetch = n + NB + PREFETCH <= N;
    int64_t m = 0;
    for (; m + 4 <= M; m += 4) rows_of_x<4>(x + m * K, w, b, y + m * N, N, K, n, fetch && m == 0);
    if (m + 2 <= M) { rows_of_x<2>(x + m * K, w, b, y + m * N, N, K, n, fetch && m == 0); m += 2; }
    if (m < M) rows_of_x<1>(x + m * K, w, b, y + m * N, N, K, n, fetch && m == 0);
  }
  for (; n < n1; ++n)
    for (int64_t m = 0; m < M; ++m) y[m * N + n] = dot(x + m * K, w + n * K, K) + (b ? b[n] : 0.0f);
}

extern "C" const char* kvb_few_rows_isa() { return ISA; }

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
