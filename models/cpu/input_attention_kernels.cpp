// CPU kernels for alpha_F, attention on a convolution's input (input_attentive_conv.py):
//
//   alpha_c = sigmoid(MLP(mean_p f) + MLP(max_p f))          per (b, c, h)     [PyTorch, small]
//   a       = alpha_c f
//   alpha_s = sigmoid(conv([mean_c a, max_c a]))            per (b, h, p)     [PyTorch, small]
//   out     = f - alpha_s a
//
// PyTorch runs the big-tensor steps as a dozen separate passes over f-sized memory forward and
// twice that backward (statistics, products, broadcasts, zero-filled gradients, sums of
// gradients); these loops make three passes forward and three backward, and never write a.
//
// Layouts (contiguous, row-major): f, out and their gradients (B, C, H, P), P = X * Y pixels,
// H = 1 for a planar (lifting) input; alpha_c (B, C, H); alpha_s, the channel statistics and
// their gradients (B, H, P); the spatial statistics (B, C, H). Ties of a max go to the first
// (lowest pixel or channel), like torch.max, so gradients reach the same element.
// geometry: {B, C, H, P}. Each thread runs a kernel over its share of planes (b, c, h) or of
// (b, h) pairs.

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>
#include <omp.h>

namespace {

struct Geometry {
    int64_t b, c, h, p;
    explicit Geometry(const int64_t* g) : b(g[0]), c(g[1]), h(g[2]), p(g[3]) {}
    int64_t plane(int64_t b_, int64_t c_, int64_t h_) const { return ((b_ * c + c_) * h + h_) * p; }
};

// Runs body(i) for i in [0, n) on `workers` threads of the OpenMP runtime PyTorch has loaded
// (a pool of our own would compete with PyTorch's spinning threads for the cores).
template <typename Body>
void parallel(int64_t workers, int64_t n, Body&& body) {
#pragma omp parallel num_threads(static_cast<int>(workers))
    {
        const int64_t thread = omp_get_thread_num(), threads = omp_get_num_threads();
        for (int64_t i = n * thread / threads, end = n * (thread + 1) / threads; i < end; ++i) body(i);
    }
}

// Mean, max and the first argmax of every plane (b, c, h) over its P pixels.
template <typename T>
void spatial_stats(const Geometry& g, int64_t workers, const T* f, T* mean, T* peak, int64_t* where) {
    parallel(workers, g.b * g.c * g.h, [&](int64_t i) {
        const T* x = f + i * g.p;
        T sum = 0, top = -std::numeric_limits<T>::infinity();
#pragma omp simd reduction(+ : sum) reduction(max : top)
        for (int64_t p = 0; p < g.p; ++p) {
            sum += x[p];
            top = x[p] > top ? x[p] : top;
        }
        // The first pixel holding the max: whole blocks tested at once (vector compares; a scan one pixel at a
        // time took as long as the pass above), then the pixels of the block that has it.
        constexpr int64_t BLOCK = 32;
        int64_t at = 0;
        for (; at + BLOCK <= g.p; at += BLOCK) {
            int hits = 0;
#pragma omp simd reduction(+ : hits)
            for (int64_t j = 0; j < BLOCK; ++j) hits += x[at + j] == top;
            if (hits) break;
        }
        while (at < g.p - 1 && !(x[at] == top)) ++at;
        mean[i] = sum / static_cast<T>(g.p);
        peak[i] = top;
        where[i] = at;
    });
}

// The gradient of the spatial statistics, added to df: dmean / P everywhere, dmax at the argmax.
template <typename T>
void spatial_stats_backward(const Geometry& g, int64_t workers, const T* dmean, const T* dpeak,
                            const int64_t* where, T* df) {
    parallel(workers, g.b * g.c * g.h, [&](int64_t i) {
        T* d = df + i * g.p;
        const T share = dmean[i] / static_cast<T>(g.p);
#pragma omp simd
        for (int64_t p = 0; p < g.p; ++p) d[p] += share;
        d[where[i]] += dpeak[i];
    });
}

// Mean and max over c of a = alpha_c f at every (b, h, p), and the first channel reaching the max. A tile of
// pixels at a time goes through every c, its running sum, max and winner on the stack (in the L1 cache): over a
// whole plane they were L2-sized (80 KB for a 94 x 94 plane) and read and written back once per channel, which
// took as long as two passes over f. Each pixel's additions run in the same order (c = 0, 1, ...).
template <typename T>
void channel_stats(const Geometry& g, int64_t workers, const T* f, const T* alpha, T* mean, T* peak,
                   uint8_t* winner) {
    constexpr int64_t TILE = 256;
    parallel(workers, g.b * g.h, [&](int64_t i) {
        const int64_t b = i / g.h, h = i % g.h;
        const T scale = T(1) / static_cast<T>(g.c);
        for (int64_t p0 = 0; p0 < g.p; p0 += TILE) {
            const int64_t n = std::min(TILE, g.p - p0);
            T sum[TILE], top[TILE];
            uint8_t win[TILE];
            {
                const T* x = f + g.plane(b, 0, h) + p0;
                const T w = alpha[(b * g.c) * g.h + h];
#pragma omp simd
                for (int64_t p = 0; p < n; ++p) {
                    sum[p] = w * x[p];
                    top[p] = w * x[p];
                    win[p] = 0;
                }
            }
            for (int64_t c = 1; c < g.c; ++c) {
                const T* x = f + g.plane(b, c, h) + p0;
                const T w = alpha[(b * g.c + c) * g.h + h];
                const uint8_t tag = static_cast<uint8_t>(c);
#pragma omp simd
                for (int64_t p = 0; p < n; ++p) {
                    const T v = w * x[p];
                    sum[p] += v;
                    const bool higher = v > top[p];
                    top[p] = higher ? v : top[p];
                    win[p] = higher ? tag : win[p];
                }
            }
            T* m = mean + i * g.p + p0;
            T* t = peak + i * g.p + p0;
            uint8_t* wn = winner + i * g.p + p0;
#pragma omp simd
            for (int64_t p = 0; p < n; ++p) {
                m[p] = sum[p] * scale;
                t[p] = top[p];
                wn[p] = win[p];
            }
        }
    });
}

// The gradient of the channel statistics: da = dmean / C (+ dmax where c won); df += alpha_c da and
// dalpha_c += sum_p f da (both accumulated).
template <typename T>
void channel_stats_backward(const Geometry& g, int64_t workers, const T* f, const T* alpha, const uint8_t* winner,
                            const T* dmean, const T* dpeak, T* df, T* dalpha) {
    parallel(workers, g.b * g.h, [&](int64_t i) {
        const int64_t b = i / g.h, h = i % g.h;
        const T* dm = dmean + i * g.p;
        const T* dx = dpeak + i * g.p;
        const uint8_t* win = winner + i * g.p;
        const T scale = T(1) / static_cast<T>(g.c);
        for (int64_t c = 0; c < g.c; ++c) {
            const int64_t at = g.plane(b, c, h);
            const T* x = f + at;
            T* d = df + at;
            const int64_t k = (b * g.c + c) * g.h + h;
            const T w = alpha[k];
            const uint8_t tag = static_cast<uint8_t>(c);
            T total = 0;
#pragma omp simd reduction(+ : total)
            for (int64_t p = 0; p < g.p; ++p) {
                const T da = dm[p] * scale + (win[p] == tag ? dx[p] : T(0));
                d[p] += w * da;
                total += x[p] * da;
            }
            dalpha[k] += total;
        }
    });
}

// One gated value: f - alpha_s (alpha_c f), one expression for both gates below, so that they round alike.
template <typename T>
inline T gated(T x, T w, T s) {
    return x - s * (w * x);
}

// out = f - alpha_s (alpha_c f).
template <typename T>
void gate(const Geometry& g, int64_t workers, const T* f, const T* alpha, const T* spatial, T* out) {
    parallel(workers, g.b * g.h, [&](int64_t i) {
        const int64_t b = i / g.h, h = i % g.h;
        const T* s = spatial + i * g.p;
        for (int64_t c = 0; c < g.c; ++c) {
            const int64_t at = g.plane(b, c, h);
            const T* x = f + at;
            T* y = out + at;
            const T w = alpha[(b * g.c + c) * g.h + h];
#pragma omp simd
            for (int64_t p = 0; p < g.p; ++p) y[p] = gated(x[p], w, s[p]);
        }
    });
}

// The gate averaged over k x k tiles of each (X, Y) plane (X, Y multiples of k), for a pointwise convolution that
// runs on the pooled input (gconv.convolve_and_pool): one pass that writes a k^2-th of the gate's output, instead
// of the gate and then the pooling's passes. The same additions as pooling.spatial_avg_pool's tiles: the k rows
// of a tile summed in order, then its k columns, times 1 / k^2. out: (B, C, H, X / k * Y / k).
template <typename T>
void gate_pool(const Geometry& g, int64_t workers, int64_t rows, int64_t k, const T* f, const T* alpha,
               const T* spatial, T* out) {
    const int64_t cols = g.p / rows, out_rows = rows / k, out_cols = cols / k;
    const T scale = T(1) / static_cast<T>(k * k);
    parallel(workers, g.b * g.h, [&](int64_t i) {
        const int64_t b = i / g.h, h = i % g.h;
        std::vector<T> band(cols);  // one output row's k input rows, summed
        for (int64_t c = 0; c < g.c; ++c) {
            const T* x = f + g.plane(b, c, h);
            const T* s = spatial + i * g.p;
            const T w = alpha[(b * g.c + c) * g.h + h];
            T* y = out + g.plane(b, c, h) / (k * k);
            for (int64_t r = 0; r < out_rows; ++r) {
                const int64_t top = r * k * cols;
#pragma omp simd
                for (int64_t q = 0; q < cols; ++q) band[q] = gated(x[top + q], w, s[top + q]);
                for (int64_t j = 1; j < k; ++j) {
                    const int64_t at = top + j * cols;
#pragma omp simd
                    for (int64_t q = 0; q < cols; ++q) band[q] += gated(x[at + q], w, s[at + q]);
                }
                for (int64_t q = 0; q < out_cols; ++q) {
                    T total = band[q * k];
                    for (int64_t j = 1; j < k; ++j) total += band[q * k + j];
                    y[r * out_cols + q] = total * scale;
                }
            }
        }
    });
}

// The gradient of the gate: df = dout - alpha_s alpha_c dout (written), dalpha_s = -sum_c alpha_c f dout
// (written), dalpha_c = -sum_p alpha_s f dout (written).
template <typename T>
void gate_backward(const Geometry& g, int64_t workers, const T* f, const T* alpha, const T* spatial, const T* dout,
                   T* df, T* dspatial, T* dalpha) {
    parallel(workers, g.b * g.h, [&](int64_t i) {
        const int64_t b = i / g.h, h = i % g.h;
        const T* s = spatial + i * g.p;
        T* ds = dspatial + i * g.p;
#pragma omp simd
        for (int64_t p = 0; p < g.p; ++p) ds[p] = 0;
        for (int64_t c = 0; c < g.c; ++c) {
            const int64_t at = g.plane(b, c, h);
            const T* x = f + at;
            const T* dy = dout + at;
            T* d = df + at;
            const int64_t k = (b * g.c + c) * g.h + h;
            const T w = alpha[k];
            T total = 0;
#pragma omp simd reduction(+ : total)
            for (int64_t p = 0; p < g.p; ++p) {
                const T wdy = w * dy[p];
                d[p] = dy[p] - s[p] * wdy;
                ds[p] -= wdy * x[p];
                total += s[p] * x[p] * dy[p];
            }
            dalpha[k] = -total;
        }
    });
}

}  // namespace

// C entry points for ctypes, one per kernel and dtype: geometry {B, C, H, P}, threads, then the tensors.
#define AAGC_INPUT_EXPORT(T, suffix)                                                                           \
    extern "C" void input_spatial_stats_##suffix(const int64_t* g, int64_t w, const T* f, T* mean, T* peak,    \
                                                 int64_t* where) {                                            \
        spatial_stats<T>(Geometry(g), w, f, mean, peak, where);                                               \
    }                                                                                                         \
    extern "C" void input_spatial_stats_backward_##suffix(const int64_t* g, int64_t w, const T* dmean,         \
                                                          const T* dpeak, const int64_t* where, T* df) {      \
        spatial_stats_backward<T>(Geometry(g), w, dmean, dpeak, where, df);                                   \
    }                                                                                                         \
    extern "C" void input_channel_stats_##suffix(const int64_t* g, int64_t w, const T* f, const T* alpha,      \
                                                 T* mean, T* peak, uint8_t* winner) {                         \
        channel_stats<T>(Geometry(g), w, f, alpha, mean, peak, winner);                                       \
    }                                                                                                         \
    extern "C" void input_channel_stats_backward_##suffix(const int64_t* g, int64_t w, const T* f,             \
                                                          const T* alpha, const uint8_t* winner,              \
                                                          const T* dmean, const T* dpeak, T* df, T* dalpha) { \
        channel_stats_backward<T>(Geometry(g), w, f, alpha, winner, dmean, dpeak, df, dalpha);                \
    }                                                                                                         \
    extern "C" void input_gate_##suffix(const int64_t* g, int64_t w, const T* f, const T* alpha,               \
                                        const T* spatial, T* out) {                                           \
        gate<T>(Geometry(g), w, f, alpha, spatial, out);                                                      \
    }                                                                                                         \
    extern "C" void input_gate_pool_##suffix(const int64_t* g, int64_t w, int64_t rows, int64_t k, const T* f,    \
                                             const T* alpha, const T* spatial, T* out) {                      \
        gate_pool<T>(Geometry(g), w, rows, k, f, alpha, spatial, out);                                        \
    }                                                                                                         \
    extern "C" void input_gate_backward_##suffix(const int64_t* g, int64_t w, const T* f, const T* alpha,      \
                                                 const T* spatial, const T* dout, T* df, T* dspatial,         \
                                                 T* dalpha) {                                                 \
        gate_backward<T>(Geometry(g), w, f, alpha, spatial, dout, df, dspatial, dalpha);                      \
    }

AAGC_INPUT_EXPORT(float, f32)
AAGC_INPUT_EXPORT(double, f64)
