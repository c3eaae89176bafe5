/* The plain step's sampler over one logits row, in one call (decode/plain_sampling.py says the
   method; decode/native_sampling.py compiles this file on first use and calls it by ctypes).

   Right after a decode, every numpy call over the 151,936-float row cost 10-60 us (the max,
   the compare, flatnonzero, the head's exp and cumsum: ~0.2 ms a token on a 2-core CPU); here
   the row is read twice (maximum; tokens within gap * T of it) with SSE2 where the compiler
   has it, and the head is weighed in double precision.

   redwood_sample_head(row[n], temperature, gap, u01, ids[n], cdf[n], out[4]):
     top = max row, floor = (float)(top - gap * T), head = {i : row[i] >= floor} ascending in
     ids[0..h), cdf[k] = sum over the head's first k + 1 tokens of exp((row - top) / T),
     out = {top, floor, head mass cdf[h - 1], h}; then with u = u01 * (head mass + (n - h) *
     exp(-gap)) it returns the head token where cdf first exceeds u, or
     -1  the draw fell in the envelope's tail (the caller draws the tail token),
     -2  the row is not usable: a NaN anywhere, or a maximum that is not finite. */
#include <math.h>
#include <stdint.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

static int is_nan_bits(float x)
{
    union { float f; uint32_t u; } v = { x };
    return (v.u & 0x7fffffffu) > 0x7f800000u;
}

/* The row's maximum; *nan: some logit is a NaN. */
static float row_max(const float *row, int64_t n, int *nan)
{
    int64_t i = 0;
    float top = -INFINITY;
    int found = 0;
#if defined(__SSE2__)
    const __m128i magnitude = _mm_set1_epi32(0x7fffffff), inf = _mm_set1_epi32(0x7f800000);
    __m128 m0 = _mm_set1_ps(-INFINITY), m1 = m0, m2 = m0, m3 = m0;
    __m128i bad = _mm_setzero_si128();
    for (; i + 16 <= n; i += 16) {
        __m128 a = _mm_loadu_ps(row + i), b = _mm_loadu_ps(row + i + 4);
        __m128 c = _mm_loadu_ps(row + i + 8), d = _mm_loadu_ps(row + i + 12);
        m0 = _mm_max_ps(m0, a); m1 = _mm_max_ps(m1, b);
        m2 = _mm_max_ps(m2, c); m3 = _mm_max_ps(m3, d);
        /* |bits| above an infinity's: a NaN (max_ps would drop it) */
        bad = _mm_or_si128(bad, _mm_cmpgt_epi32(_mm_and_si128(_mm_castps_si128(a), magnitude), inf));
        bad = _mm_or_si128(bad, _mm_cmpgt_epi32(_mm_and_si128(_mm_castps_si128(b), magnitude), inf));
        bad = _mm_or_si128(bad, _mm_cmpgt_epi32(_mm_and_si128(_mm_castps_si128(c), magnitude), inf));
        bad = _mm_or_si128(bad, _mm_cmpgt_epi32(_mm_and_si128(_mm_castps_si128(d), magnitude), inf));
    }
    float lanes[4];
    _mm_storeu_ps(lanes, _mm_max_ps(_mm_max_ps(m0, m1), _mm_max_ps(m2, m3)));
    for (int j = 0; j < 4; j++)
        top = lanes[j] > top ? lanes[j] : top;
    found = _mm_movemask_epi8(bad) != 0;
#endif
    for (; i < n; i++) {
        found |= is_nan_bits(row[i]);
        top = row[i] > top ? row[i] : top;
    }
    *nan = found;
    return top;
}

/* ids of the logits >= floor, ascending; their count. */
static int64_t row_head(const float *row, int64_t n, float floor, int32_t *ids)
{
    int64_t h = 0, i = 0;
#if defined(__SSE2__)
    const __m128 f = _mm_set1_ps(floor);
    for (; i + 16 <= n; i += 16) {
        __m128 a = _mm_cmpge_ps(_mm_loadu_ps(row + i), f);
        __m128 b = _mm_cmpge_ps(_mm_loadu_ps(row + i + 4), f);
        __m128 c = _mm_cmpge_ps(_mm_loadu_ps(row + i + 8), f);
        __m128 d = _mm_cmpge_ps(_mm_loadu_ps(row + i + 12), f);
        if (!_mm_movemask_ps(_mm_or_ps(_mm_or_ps(a, b), _mm_or_ps(c, d))))
            continue;                       /* most blocks hold nothing near the top */
        for (int64_t j = i; j < i + 16; j++)
            if (row[j] >= floor)
                ids[h++] = (int32_t)j;
    }
#endif
    for (; i < n; i++)
        if (row[i] >= floor)
            ids[h++] = (int32_t)i;
    return h;
}

int64_t redwood_sample_head(const float *row, int64_t n, double temperature, double gap,
                            double u01, int32_t *ids, double *cdf, double *out)
{
    int nan;
    float top = row_max(row, n, &nan);
    if (nan || !isfinite(top))
        return -2;
    double dtop = (double)top, scale = 1.0 / temperature, total = 0.0;
    float floor = (float)(dtop - gap * temperature);
    int64_t h = row_head(row, n, floor, ids);
    for (int64_t k = 0; k < h; k++) {
        total += exp(((double)row[ids[k]] - dtop) * scale);
        cdf[k] = total;
    }
    out[0] = dtop;
    out[1] = (double)floor;
    out[2] = total;
    out[3] = (double)h;
    double u = u01 * (total + (double)(n - h) * exp(-gap));
    if (u >= total)
        return -1;
    int64_t lo = 0, hi = h;                 /* the first k with cdf[k] > u */
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        if (cdf[mid] > u)
            hi = mid;
        else
            lo = mid + 1;
    }
    return ids[lo < h ? lo : h - 1];
}
