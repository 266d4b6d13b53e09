// Inference kernels of the PCam networks in bfloat16, channels last (bfloat16_kernels.py).
//
// oneDNN convolves bfloat16 channels-last maps at several times its float32 rate where the CPU has AMX or
// AVX512-BF16; these loops do the rest of a layer on the same tensors, so that no layer converts its input's
// dtype or layout: DenseNets' relu(bn(cat(parts))) and alpha_F's statistics, spatial filter and gate,
//
//   alpha_c = sigmoid(MLP(mean_p f) + MLP(max_p f))          per (b, c, h)     [PyTorch, float32, small]
//   alpha_s = sigmoid(conv([mean_c a, max_c a]))            per (b, p, h)     [AMX tiles or a float32 loop]
//   out     = f - alpha_s (alpha_c f)                        a = alpha_c f, never written
//
// Storage is bfloat16 (uint16_t here: the upper half of a float32); every sum, product and statistic is computed
// in float32 and rounded once, to nearest even as PyTorch rounds, when it is stored.
//
// Layouts: a group map (B, C, H, X, Y) is held channels last, (B, P, C, H), P = X * Y pixels, one pixel's C * H
// values contiguous (H = 1 for an image): the memory of a channels-last (B, C * H, X, Y) tensor, which is what the
// convolutions read and write. alpha_c (B, C, H) is float32; the spatial filter reads the channel statistics
// padded (Planes: float32 planes for the AVX-512 loop, split bfloat16 pixels for the AMX tiles) and writes its
// output channels last (B, P, H_out).

#include <algorithm>
#include <bit>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>
#include <omp.h>

namespace {

using bf16 = uint16_t;

inline float load(bf16 v) { return std::bit_cast<float>(static_cast<uint32_t>(v) << 16); }

// Round to nearest even, NaN kept a (quiet) NaN: c10::BFloat16's rounding, so a stored value equals PyTorch's cast
// of the same float32.
inline bf16 store(float f) {
    const uint32_t u = std::bit_cast<uint32_t>(f);
    const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    return f != f ? bf16(0x7fc0) : static_cast<bf16>(rounded);
}

// The innermost loops over a run of contiguous values, twice: with AVX-512 intrinsics (16 floats a vector, the
// bfloat16 rounding in one instruction where the CPU has AVX512-BF16), and as plain loops for the compiler to
// vectorise elsewhere. GCC vectorised the plain loops here with 256-bit vectors at about half the rate.
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define AAGC_AVX512 1
#include <immintrin.h>

inline __mmask16 first(int64_t n) { return n >= 16 ? __mmask16(0xffff) : __mmask16((1u << n) - 1); }

inline __m512 load16(const bf16* p, int64_t n = 16) {
    const __m256i raw = _mm256_maskz_loadu_epi16(first(n), p);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}

inline __m512 loadf(const float* p, int64_t n = 16) { return _mm512_maskz_loadu_ps(first(n), p); }

inline void store16(bf16* p, __m512 v, int64_t n = 16) {
#if defined(__AVX512BF16__)
    const __m256i rounded = reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(v));
#else
    const __m512i u = _mm512_castps_si512(v);
    const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7fff))), 16);
    r = _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), _mm512_set1_epi32(0x7fc0));
    const __m256i rounded = _mm512_cvtepi32_epi16(r);
#endif
    _mm256_mask_storeu_epi16(p, first(n), rounded);
}

// The H values of a pixel's alpha_s repeated over 16 lanes (lane l holds h = l % H; H divides 16).
template <int64_t H>
inline __m512 repeated(const float* s) {
    if constexpr (H == 16) return _mm512_loadu_ps(s);
    if constexpr (H == 8) return _mm512_broadcast_f32x8(_mm256_loadu_ps(s));
    if constexpr (H == 4) return _mm512_broadcast_f32x4(_mm_loadu_ps(s));
    return _mm512_set1_ps(s[0]);
}
#endif

// out[j] = max(0, in[j] a[j] + z[j]), j < n.
inline void affine_relu(const bf16* in, const float* a, const float* z, bf16* out, int64_t n) {
#ifdef AAGC_AVX512
    for (int64_t j = 0; j < n; j += 16) {
        const int64_t m = n - j;
        const __m512 v = _mm512_fmadd_ps(load16(in + j, m), loadf(a + j, m), loadf(z + j, m));
        store16(out + j, _mm512_max_ps(v, _mm512_setzero_ps()), m);  // vmaxps keeps its second operand for NaN
    }
#else
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) {
        const float v = load(in[j]) * a[j] + z[j];
        out[j] = store(v < 0.0f ? 0.0f : v);  // NaN stays NaN, as torch.relu
    }
#endif
}

// sum[j] += x[j], top[j] = max(top[j], x[j]), j < n.
inline void sum_and_max(const bf16* x, float* sum, float* top, int64_t n) {
#ifdef AAGC_AVX512
    for (int64_t j = 0; j < n; j += 16) {
        const int64_t m = n - j;
        const __m512 v = load16(x + j, m);
        _mm512_mask_storeu_ps(sum + j, first(m), _mm512_add_ps(loadf(sum + j, m), v));
        _mm512_mask_storeu_ps(top + j, first(m), _mm512_max_ps(v, loadf(top + j, m)));
    }
#else
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) {
        const float v = load(x[j]);
        sum[j] += v;
        top[j] = v > top[j] ? v : top[j];
    }
#endif
}

// One pixel's gate: out[j] = x - s[j % H] (w[j] x), j < width (a multiple of H); with copies 2 also out[width + j]
// (the input of a convolution by split weights, models.gconv.split_bank, which reads each channel twice).
template <int64_t H>
inline void gate_pixel(const bf16* x, const float* w, const float* s, bf16* out, int64_t width, int64_t copies) {
#ifdef AAGC_AVX512
    const __m512 sv = repeated<H>(s);
    for (int64_t j = 0; j < width; j += 16) {
        const int64_t m = width - j;
        const __m512 v = load16(x + j, m);
        const __m512 g = _mm512_fnmadd_ps(sv, _mm512_mul_ps(loadf(w + j, m), v), v);
        store16(out + j, g, m);
        if (copies > 1) store16(out + width + j, g, m);
    }
#else
    for (int64_t j = 0; j < width; j += H) {
#pragma omp simd
        for (int64_t h = 0; h < H; ++h) {
            const float v = load(x[j + h]);
            out[j + h] = store(v - s[h] * (w[j + h] * v));
        }
    }
    if (copies > 1) std::copy(out, out + width, out + width);
#endif
}

// One pixel's gate added to acc (float32), for the pooled gate.
template <int64_t H>
inline void gate_pixel_into(const bf16* x, const float* w, const float* s, float* acc, int64_t width) {
#ifdef AAGC_AVX512
    const __m512 sv = repeated<H>(s);
    for (int64_t j = 0; j < width; j += 16) {
        const int64_t m = width - j;
        const __m512 v = load16(x + j, m);
        const __m512 g = _mm512_fnmadd_ps(sv, _mm512_mul_ps(loadf(w + j, m), v), v);
        _mm512_mask_storeu_ps(acc + j, first(m), _mm512_add_ps(loadf(acc + j, m), g));
    }
#else
    for (int64_t j = 0; j < width; j += H) {
#pragma omp simd
        for (int64_t h = 0; h < H; ++h) {
            const float v = load(x[j + h]);
            acc[j + h] += v - s[h] * (w[j + h] * v);
        }
    }
#endif
}

// out[j] = acc[j] * scale, rounded, j < n; with copies 2 also out[n + j].
inline void scaled_store(const float* acc, float scale, bf16* out, int64_t n, int64_t copies) {
#ifdef AAGC_AVX512
    for (int64_t j = 0; j < n; j += 16) {
        const __m512 v = _mm512_mul_ps(loadf(acc + j, n - j), _mm512_set1_ps(scale));
        store16(out + j, v, n - j);
        if (copies > 1) store16(out + n + j, v, n - j);
    }
#else
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) out[j] = store(acc[j] * scale);
    if (copies > 1) std::copy(out, out + n, out + n);
#endif
}

// AMX, where the compiler targets it: the spatial filter as tile products (below). Linux hands a process the tile
// registers once it asks for them (arch_prctl ARCH_REQ_XCOMP_PERM, XTILEDATA); where it refuses, the AVX-512 loop
// runs instead.
#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(AAGC_AVX512)
#define AAGC_AMX 1
#include <sys/syscall.h>
#include <unistd.h>

bool amx_permitted() {
    static const bool permitted = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0;
    return permitted;
}

struct alignas(64) TileConfig {
    uint8_t palette = 1, start_row = 0, reserved[14] = {};
    uint16_t colsb[16] = {};
    uint8_t rows[16] = {};
};
#else
bool amx_permitted() { return false; }
#endif

// Runs body(i) for i in [0, n) on `workers` threads of the OpenMP runtime PyTorch has loaded.
template <typename Body>
void parallel(int64_t workers, int64_t n, Body&& body) {
#pragma omp parallel num_threads(static_cast<int>(std::max<int64_t>(1, std::min(workers, n))))
    {
        const int64_t thread = omp_get_thread_num(), threads = omp_get_num_threads();
        for (int64_t i = n * thread / threads, end = n * (thread + 1) / threads; i < end; ++i) body(i);
    }
}

// Pixels per task of the per-pixel loops: a few hundred KB of a map, many tasks per thread.
constexpr int64_t PIXELS = 256;

// out (B, X, Y, C * G) = max(0, cat(parts) * scale + shift), scale and shift given per value of a pixel (C * G).
// Each part: {C_i * G, stride_b, stride_x, stride_y} in values, its pixel's C_i * G values contiguous (a cropped
// view of a channels-last map is fine). geometry: {B, X, Y, parts}.
void relu_bn(const int64_t* geometry, int64_t workers, const int64_t* strides, const bf16* const* parts,
             const float* scale, const float* shift, bf16* out) {
    const int64_t b_n = geometry[0], x_n = geometry[1], y_n = geometry[2], n_parts = geometry[3];
    int64_t width = 0;
    for (int64_t i = 0; i < n_parts; ++i) width += strides[4 * i];
    parallel(workers, b_n * x_n, [&](int64_t row) {
        const int64_t b = row / x_n, x = row % x_n;
        for (int64_t y = 0; y < y_n; ++y) {
            bf16* o = out + (row * y_n + y) * width;
            int64_t first = 0;
            for (int64_t i = 0; i < n_parts; ++i) {
                const int64_t* s = strides + 4 * i;
                affine_relu(parts[i] + b * s[1] + x * s[2] + y * s[3], scale + first, shift + first, o + first, s[0]);
                first += s[0];
            }
        }
    });
}

// Mean and max over the P pixels of every (b, c, h): mean, peak (B, C * H) float32. geometry: {B, P, C * H}.
void spatial_stats(const int64_t* geometry, int64_t workers, const bf16* f, float* mean, float* peak) {
    const int64_t b_n = geometry[0], p_n = geometry[1], width = geometry[2];
    parallel(workers, b_n, [&](int64_t b) {
        std::vector<float> sum(width, 0.0f), top(width, -std::numeric_limits<float>::infinity());
        float* s = sum.data();
        float* t = top.data();
        for (int64_t p = 0; p < p_n; ++p) sum_and_max(f + (b * p_n + p) * width, s, t, width);
        for (int64_t j = 0; j < width; ++j) {
            mean[b * width + j] = sum[j] / static_cast<float>(p_n);
            peak[b * width + j] = top[j];
        }
    });
}

// Where the channel statistics of pixel (b, x, y) go, padded by pad on every side: as float32 planes (B, 2 H, X + 2
// pad, Y + 2 pad) for the AVX-512 filter, or bfloat16 pixels (B, X + 2 pad, Y + 2 pad, 2 H) for the AMX filter;
// channel h the mean, H + h the max.
struct Planes {
    float* planes;
    bf16* pixels;  // each statistic v as hi = bf16(v), then lo = bf16(v - hi): 4 H values a pixel
    int64_t h, rows, cols;
    void put(int64_t b, int64_t at, int64_t j, float v) const {
        if (pixels) {
            bf16* pixel = pixels + ((b * rows * cols) + at) * 4 * h;
            pixel[j] = store(v);
            pixel[2 * h + j] = store(v - load(pixel[j]));
        } else {
            planes[((b * 2 * h + j) * rows * cols) + at] = v;
        }
    }
};

// The mean and max over c of a = alpha_c f at every (b, p, h), into the spatial filter's padded input (Planes).
// geometry: {B, X, Y, C, H, pad}.
template <int64_t H>
void channel_stats_of(const int64_t* geometry, int64_t workers, const bf16* f, const float* alpha, Planes out) {
    const int64_t b_n = geometry[0], x_n = geometry[1], y_n = geometry[2], c_n = geometry[3], pad = geometry[5];
    const int64_t p_n = x_n * y_n, tasks = (p_n + PIXELS - 1) / PIXELS, rows = x_n + 2 * pad, cols = y_n + 2 * pad;
    const float scale = 1.0f / static_cast<float>(c_n);
    parallel(workers, b_n * tasks, [&](int64_t task) {
        const int64_t b = task / tasks, p0 = task % tasks * PIXELS, p1 = std::min(p_n, p0 + PIXELS);
        const float* w = alpha + b * c_n * H;
        int64_t p = p0;
#ifdef AAGC_AVX512
        if constexpr (H == 4 || H == 8) {  // a vector holds 16 / H channels of H orientations; folded at the end
            const int64_t width = c_n * H;
            for (; p < p1; ++p) {
                const bf16* x = f + (b * p_n + p) * width;
                __m512 sum = _mm512_setzero_ps(), top = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
                for (int64_t j = 0; j < width; j += 16) {
                    const int64_t m = width - j;
                    const __m512 v = _mm512_mul_ps(loadf(w + j, m), load16(x + j, m));
                    sum = _mm512_add_ps(sum, v);  // masked-off lanes add 0
                    top = _mm512_mask_max_ps(top, first(m), v, top);
                }
                const int64_t at = (p / y_n + pad) * cols + p % y_n + pad;
                if (H == 8 && out.pixels) {  // both halves folded in vectors, the pixel's 16 values in one store
                    const __m256 total = _mm256_add_ps(_mm512_castps512_ps256(sum), _mm512_extractf32x8_ps(sum, 1));
                    const __m256 best = _mm256_max_ps(_mm512_extractf32x8_ps(top, 1), _mm512_castps512_ps256(top));
                    const __m512 both = _mm512_insertf32x8(
                        _mm512_castps256_ps512(_mm256_mul_ps(total, _mm256_set1_ps(scale))), best, 1);
                    bf16* pixel = out.pixels + (b * rows * cols + at) * 4 * H;
                    store16(pixel, both);
                    store16(pixel + 2 * H, _mm512_sub_ps(both, load16(pixel)));
                    continue;
                }
                alignas(64) float sums[16], tops[16];
                _mm512_store_ps(sums, sum);
                _mm512_store_ps(tops, top);
                for (int64_t h = 0; h < H; ++h) {
                    float total = sums[h], best = tops[h];
                    for (int64_t q = H; q < 16; q += H) {
                        total += sums[q + h];
                        best = tops[q + h] > best ? tops[q + h] : best;
                    }
                    out.put(b, at, h, total * scale);
                    out.put(b, at, H + h, best);
                }
            }
        }
#endif
        for (; p < p1; ++p) {
            const bf16* x = f + (b * p_n + p) * c_n * H;
            float sum[H], top[H];
            for (int64_t h = 0; h < H; ++h) {
                sum[h] = w[h] * load(x[h]);
                top[h] = sum[h];
            }
            for (int64_t c = 1; c < c_n; ++c) {
#pragma omp simd
                for (int64_t h = 0; h < H; ++h) {
                    const float v = w[c * H + h] * load(x[c * H + h]);
                    sum[h] += v;
                    top[h] = v > top[h] ? v : top[h];
                }
            }
            const int64_t at = (p / y_n + pad) * cols + p % y_n + pad;
            for (int64_t h = 0; h < H; ++h) {
                out.put(b, at, h, sum[h] * scale);
                out.put(b, at, H + h, top[h]);
            }
        }
    });
}

// The spatial filter: a k x k convolution with dilation d of the padded planes in (B, C_in, X + 2 pad, Y + 2 pad)
// (pad = d (k / 2), zeros around; 16 floats readable past the end), by weights (k, k, C_in, COUT) (tap first, the
// output channels innermost), into out (B, X, Y, COUT) channels last. Sixteen output pixels of a row at a time,
// each input vector used by all COUT outputs from registers: a direct loop for a filter bank too narrow for
// oneDNN's blocked kernels (16 -> 8 channels ran at 27 G multiply-adds/s in float32, 54 in bfloat16, here).
// geometry: {B, X, Y, C_in, k, d}.
template <int64_t COUT>
void spatial_conv_of(const int64_t* geometry, int64_t workers, const float* in, const float* weight, float* out) {
    const int64_t b_n = geometry[0], x_n = geometry[1], y_n = geometry[2], c_n = geometry[3], k = geometry[4],
                  d = geometry[5];
    const int64_t pad = d * (k / 2), rows = x_n + 2 * pad, cols = y_n + 2 * pad;
    constexpr int64_t L = 16;
    parallel(workers, b_n * x_n, [&](int64_t task) {
        const int64_t b = task / x_n, x = task % x_n;
        for (int64_t y0 = 0; y0 < y_n; y0 += L) {
            alignas(64) float acc[COUT][L] = {};
#ifdef AAGC_AVX512
            __m512 sums[COUT];
            for (int64_t o = 0; o < COUT; ++o) sums[o] = _mm512_setzero_ps();
#endif
            for (int64_t c = 0; c < c_n; ++c) {
                for (int64_t ky = 0; ky < k; ++ky) {
                    const float* line = in + ((b * c_n + c) * rows + x + ky * d) * cols + y0;
                    for (int64_t kx = 0; kx < k; ++kx) {
                        const float* v = line + kx * d;
                        const float* w = weight + ((ky * k + kx) * c_n + c) * COUT;
#ifdef AAGC_AVX512
                        const __m512 vv = _mm512_loadu_ps(v);
                        for (int64_t o = 0; o < COUT; ++o) sums[o] = _mm512_fmadd_ps(vv, _mm512_set1_ps(w[o]), sums[o]);
#else
                        for (int64_t o = 0; o < COUT; ++o) {
                            const float wo = w[o];
#pragma omp simd
                            for (int64_t l = 0; l < L; ++l) acc[o][l] += v[l] * wo;
                        }
#endif
                    }
                }
            }
#ifdef AAGC_AVX512
            for (int64_t o = 0; o < COUT; ++o) _mm512_store_ps(acc[o], sums[o]);
#endif
            const int64_t n = std::min(L, y_n - y0);
            float* dst = out + ((b * x_n + x) * y_n + y0) * COUT;
            for (int64_t l = 0; l < n; ++l)
                for (int64_t o = 0; o < COUT; ++o) dst[l * COUT + o] = acc[o][l];
        }
    });
}

#ifdef AAGC_AMX
// Run I's sums (tile I) straight into dst where its 16 pixels lie inside the row, else through tail, the pixels
// inside copied. A macro: GCC's tile intrinsics paste their tile number into the instruction's text, so it must be
// a literal, not even a template argument.
#define AAGC_STORE_RUN(I)                                                                     \
    if (y0 + 16 * ((I) + 1) <= y_n) {                                                         \
        _tile_stored(I, dst + 16 * (I) * c_out, c_out * 4);                                   \
    } else {                                                                                  \
        _tile_stored(I, tail, c_out * 4);                                                     \
        std::copy(tail, tail + (y_n - y0 - 16 * (I)) * c_out, dst + 16 * (I) * c_out);        \
    }

// NC runs of 16 output pixels of one row, from y0, through every tap: NC sums in tiles 0..NC-1 (independent, so
// that one tile product's latency hides behind the others'), a tap's 16 pixels in tiles 4..6, its weights in tiles
// 3 and 7: the pixels' statistics as [hi | lo] (Planes) times [w_hi | w_hi], then times [w_lo | 0], so that the
// sums are those of the float32 statistics and weights to 16 bits of mantissa, as the float32 loop's.
template <int NC>
void tile_runs(const bf16* in, const bf16* weight, const bf16* weight_lo, float* out, float* tail, int64_t y0,
               int64_t y_n, int64_t c_in, int64_t c_out, int64_t k, int64_t d, int64_t cols) {
    _tile_zero(0);
    if constexpr (NC > 1) _tile_zero(1);
    if constexpr (NC > 2) _tile_zero(2);
    for (int64_t ky = 0; ky < k; ++ky) {
        for (int64_t kx = 0; kx < k; ++kx) {
            const bf16* a = in + (ky * d * cols + y0 + kx * d) * c_in;  // the tap's first pixel
            const int64_t stride = c_in * 2, run = 16 * c_in, tap = (ky * k + kx) * c_in * c_out;
            _tile_loadd(3, weight + tap, c_out * 4);
            _tile_loadd(7, weight_lo + tap, c_out * 4);
            _tile_loadd(4, a, stride);
            if constexpr (NC > 1) _tile_loadd(5, a + run, stride);
            if constexpr (NC > 2) _tile_loadd(6, a + 2 * run, stride);
            _tile_dpbf16ps(0, 4, 3);
            if constexpr (NC > 1) _tile_dpbf16ps(1, 5, 3);
            if constexpr (NC > 2) _tile_dpbf16ps(2, 6, 3);
            _tile_dpbf16ps(0, 4, 7);
            if constexpr (NC > 1) _tile_dpbf16ps(1, 5, 7);
            if constexpr (NC > 2) _tile_dpbf16ps(2, 6, 7);
        }
    }
    float* dst = out + y0 * c_out;
    AAGC_STORE_RUN(0)
    if constexpr (NC > 1) {
        AAGC_STORE_RUN(1)
    }
    if constexpr (NC > 2) {
        AAGC_STORE_RUN(2)
    }
}

// The spatial filter as AMX tile products: for each tap, 16 output pixels x C_in channels of the padded bfloat16
// pixels in (B, X + 2 pad, Y + 2 pad, C_in) times the tap's (C_in / 2, C_out, 2) weights (weight, then weight_lo),
// summed in float32 in a tile, written channels last to out (B, X, Y, C_out). C_in even and at most 32, C_out at
// most 16; 48 pixels of C_in readable past the end. geometry: {B, X, Y, C_in, k, d}.
void spatial_conv_tiles(const int64_t* geometry, int64_t workers, int64_t c_out, const bf16* in, const bf16* weight,
                        const bf16* weight_lo, float* out) {
    const int64_t b_n = geometry[0], x_n = geometry[1], y_n = geometry[2], c_in = geometry[3], k = geometry[4],
                  d = geometry[5];
    const int64_t pad = d * (k / 2), rows = x_n + 2 * pad, cols = y_n + 2 * pad, n = b_n * x_n;
    TileConfig config;
    const auto shape = [&](int tile, int64_t rows_, int64_t bytes) {
        config.rows[tile] = static_cast<uint8_t>(rows_);
        config.colsb[tile] = static_cast<uint16_t>(bytes);
    };
    for (int t = 0; t < 3; ++t) shape(t, 16, c_out * 4);        // the sums: 16 pixels x C_out
    for (int t : {3, 7}) shape(t, c_in / 2, c_out * 4);         // a tap's weights: pairs of input channels
    for (int t = 4; t < 7; ++t) shape(t, 16, c_in * 2);         // a tap's 16 pixels
#pragma omp parallel num_threads(static_cast<int>(std::max<int64_t>(1, std::min(workers, n))))
    {
        _tile_loadconfig(&config);  // per thread: the tile registers are each thread's own
        const int64_t thread = omp_get_thread_num(), threads = omp_get_num_threads();
        alignas(64) float tail[16 * 16];
        for (int64_t task = n * thread / threads, end = n * (thread + 1) / threads; task < end; ++task) {
            const int64_t b = task / x_n, x = task % x_n;
            const bf16* row = in + (b * rows + x) * cols * c_in;
            float* dst = out + (b * x_n + x) * y_n * c_out;
            const auto runs = [&](auto count, int64_t y) {
                tile_runs<decltype(count)::value>(row, weight, weight_lo, dst, tail, y, y_n, c_in, c_out, k, d, cols);
            };
            int64_t y0 = 0;
            for (; y0 + 32 < y_n; y0 += 48) runs(std::integral_constant<int, 3>{}, y0);
            if (y0 + 16 < y_n) runs(std::integral_constant<int, 2>{}, y0);
            else if (y0 < y_n) runs(std::integral_constant<int, 1>{}, y0);
        }
        _tile_release();
    }
}
#endif

// out = f - alpha_s (alpha_c f), pixel by pixel; alpha_s (B, P, H); out (B, P, copies C, H), the gated values
// written copies (1 or 2) times over. geometry: {B, P, C, H, copies}.
template <int64_t H>
void gate_of(const int64_t* geometry, int64_t workers, const bf16* f, const float* alpha, const float* spatial,
             bf16* out) {
    const int64_t b_n = geometry[0], p_n = geometry[1], c_n = geometry[2], copies = geometry[4];
    const int64_t tasks = (p_n + PIXELS - 1) / PIXELS;
    parallel(workers, b_n * tasks, [&](int64_t task) {
        const int64_t b = task / tasks, p0 = task % tasks * PIXELS, p1 = std::min(p_n, p0 + PIXELS);
        const float* w = alpha + b * c_n * H;
        for (int64_t p = p0; p < p1; ++p) {
            const int64_t at = (b * p_n + p) * c_n * H;
            gate_pixel<H>(f + at, w, spatial + (b * p_n + p) * H, out + at * copies, c_n * H, copies);
        }
    });
}

// The gate averaged over k x k tiles of pixels (X, Y multiples of k), for a pointwise convolution that runs on the
// pooled input: out (B, X / k, Y / k, copies C, H), as gate_of's. geometry: {B, X, Y, C, H, k, copies}.
template <int64_t H>
void gate_pool_of(const int64_t* geometry, int64_t workers, const bf16* f, const float* alpha, const float* spatial,
                  bf16* out) {
    const int64_t b_n = geometry[0], x_n = geometry[1], y_n = geometry[2], c_n = geometry[3], k = geometry[5],
                  copies = geometry[6];
    const int64_t out_rows = x_n / k, out_cols = y_n / k, width = c_n * H;
    const float scale = 1.0f / static_cast<float>(k * k);
    parallel(workers, b_n * out_rows, [&](int64_t task) {
        const int64_t b = task / out_rows, r = task % out_rows;
        const float* w = alpha + b * width;
        std::vector<float> sums(width);
        float* acc = sums.data();
        for (int64_t q = 0; q < out_cols; ++q) {
            std::fill(sums.begin(), sums.end(), 0.0f);
            for (int64_t i = 0; i < k; ++i) {
                for (int64_t j = 0; j < k; ++j) {
                    const int64_t p = b * x_n * y_n + (r * k + i) * y_n + q * k + j;
                    gate_pixel_into<H>(f + p * width, w, spatial + p * H, acc, width);
                }
            }
            scaled_store(acc, scale, out + ((b * out_rows + r) * out_cols + q) * width * copies, width, copies);
        }
    });
}

// The orientation counts the networks have (1: an image, 4: p4, 8: p4m), each compiled with its inner loop's
// length known; returns false for any other (the caller then runs PyTorch's path).
template <template <int64_t> class Kernel, typename... Args>
bool by_orientations(int64_t h, Args... args) {
    switch (h) {
        case 1: Kernel<1>::run(args...); return true;
        case 4: Kernel<4>::run(args...); return true;
        case 8: Kernel<8>::run(args...); return true;
        default: return false;
    }
}

template <int64_t H> struct ChannelStats {
    static void run(const int64_t* g, int64_t w, const bf16* f, const float* a, Planes s) {
        channel_stats_of<H>(g, w, f, a, s);
    }
};
template <int64_t H> struct Gate {
    static void run(const int64_t* g, int64_t w, const bf16* f, const float* a, const float* s, bf16* o) {
        gate_of<H>(g, w, f, a, s, o);
    }
};
template <int64_t H> struct GatePool {
    static void run(const int64_t* g, int64_t w, const bf16* f, const float* a, const float* s, bf16* o) {
        gate_pool_of<H>(g, w, f, a, s, o);
    }
};
template <int64_t H> struct SpatialConv {
    static void run(const int64_t* g, int64_t w, const float* in, const float* weight, float* o) {
        spatial_conv_of<H>(g, w, in, weight, o);
    }
};

}  // namespace

// C entry points for ctypes: geometry, threads, then the tensors; those returning int return 0 where the
// orientation count (or output channels) has no compiled kernel.
extern "C" {
void bf16_relu_bn(const int64_t* g, int64_t w, const int64_t* strides, const bf16* const* parts, const float* scale,
                  const float* shift, bf16* out) {
    relu_bn(g, w, strides, parts, scale, shift, out);
}
void bf16_spatial_stats(const int64_t* g, int64_t w, const bf16* f, float* mean, float* peak) {
    spatial_stats(g, w, f, mean, peak);
}
// stats: float32 planes, or bfloat16 pixels where `pixels` (for spatial_conv_amx).
int bf16_channel_stats(const int64_t* g, int64_t w, const bf16* f, const float* alpha, void* stats, int pixels) {
    const int64_t pad = g[5];
    const Planes out{pixels ? nullptr : static_cast<float*>(stats), pixels ? static_cast<bf16*>(stats) : nullptr,
                     g[4], g[1] + 2 * pad, g[2] + 2 * pad};
    return by_orientations<ChannelStats>(g[4], g, w, f, alpha, out);
}
// Whether spatial_conv_amx runs here: built with AMX and the tile registers granted.
int bf16_amx() { return amx_permitted(); }
int spatial_conv_amx(const int64_t* g, int64_t w, int64_t out_channels, const bf16* in, const bf16* weight,
                     const bf16* weight_lo, float* out) {
#ifdef AAGC_AMX
    if (amx_permitted() && g[3] % 2 == 0 && g[3] <= 32 && out_channels <= 16) {
        spatial_conv_tiles(g, w, out_channels, in, weight, weight_lo, out);
        return 1;
    }
#endif
    return 0;
}
int bf16_gate(const int64_t* g, int64_t w, const bf16* f, const float* alpha, const float* spatial, bf16* out) {
    return by_orientations<Gate>(g[3], g, w, f, alpha, spatial, out);
}
int bf16_gate_pool(const int64_t* g, int64_t w, const bf16* f, const float* alpha, const float* spatial,
                   bf16* out) {
    return by_orientations<GatePool>(g[4], g, w, f, alpha, spatial, out);
}
int spatial_conv(const int64_t* g, int64_t w, int64_t out_channels, const float* in, const float* weight,
                 float* out) {
    return by_orientations<SpatialConv>(out_channels, g, w, in, weight, out);
}
}
