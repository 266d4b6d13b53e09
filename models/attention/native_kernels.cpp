// CPU kernels for the full attentive convolution's statistics, never storing f~.
//
// f~(b, q, c, h, x) = sum_t P(b, c, h, x + t) K(q, c, h, t) is the response of input
// plane (c, h) to filter q = (o, g) at output position x, t running over the k * k taps.
// PyTorch has to write f~ out (C_in * G_in times a layer's output) before it can reduce
// it; these loops reduce each value as soon as it is computed.
//
// Layouts (all contiguous, row-major):
//   planes   P  (B, C, H, Xp, Yp)   input already padded
//   kernels  K  (C, H, k * k, Qp)   or per sample (B, C, H, k * k, Qp); Qp = Q rounded up
//                                   to a multiple of BLOCK, the extra filters zero
//   per-position outputs (B, X', Y', H, Q): channels last, as full_attentive_conv.py keeps them
// geometry: {C, H, Xp, Yp, X', Y', k, stride, dilation, Q, Qp}
//
// The innermost loops run over BLOCK filters, which the compiler turns into vector
// instructions. Ties go to the first maximum (lowest c or position), like torch.max.
// The caller splits the batch [b0, b1) over threads.

#include <cstdint>
#include <limits>
#include <vector>

namespace {

constexpr int BLOCK = 16;

struct Geometry {
    int64_t c, h, xp, yp, out_x, out_y, k, stride, dilation, q, qp;
    std::vector<int64_t> tap;  // offset of each filter tap from a patch's first one, in a plane

    explicit Geometry(const int64_t* g)
        : c(g[0]), h(g[1]), xp(g[2]), yp(g[3]), out_x(g[4]), out_y(g[5]), k(g[6]),
          stride(g[7]), dilation(g[8]), q(g[9]), qp(g[10]), tap(k * k) {
        // Precomputed: an integer division per tap costs more than its multiply-adds.
        for (int64_t t = 0; t < k * k; ++t) tap[t] = (t / k) * dilation * yp + (t % k) * dilation;
    }
    int64_t taps() const { return k * k; }
    int64_t plane() const { return xp * yp; }
    int64_t positions() const { return out_x * out_y; }
    // Offset of output position (x, y)'s first tap in a plane.
    int64_t origin(int64_t x, int64_t y) const { return x * stride * yp + y * stride; }
};

// acc[i][j] = sum_t patch[i * step + tap[t]] * w[t * qp + j]: f~ of one plane at TILE
// neighbouring output positions (step apart in the plane) for BLOCK filters. Several
// positions at once give independent multiply-add chains and reuse each filter load.
template <int TILE, typename T>
inline void respond(const Geometry& g, const T* __restrict__ patch, int64_t step, const T* __restrict__ w,
                    T (&acc)[TILE][BLOCK]) {
    for (int i = 0; i < TILE; ++i)
        for (int j = 0; j < BLOCK; ++j) acc[i][j] = 0;
    for (int64_t t = 0; t < g.taps(); ++t) {
        const T* wt = w + t * g.qp;
        for (int i = 0; i < TILE; ++i) {
            const T p = patch[i * step + g.tap[t]];
#pragma omp simd
            for (int j = 0; j < BLOCK; ++j) acc[i][j] += p * wt[j];
        }
    }
}

// Calls body.template operator()<n>(y0) for output columns y0 .. y0 + n - 1 covering one row:
// tiles of TILE, then single positions.
template <int TILE, typename Body>
inline void over_row(const Geometry& g, Body&& body) {
    int64_t y0 = 0;
    for (; y0 + TILE <= g.out_y; y0 += TILE) body.template operator()<TILE>(y0);
    for (; y0 < g.out_y; ++y0) body.template operator()<1>(y0);
}

// Where over positions each f~(b, ., c, h, .) is largest: where (B, C, H, Q), int64.
template <typename T>
void spatial_argmax(const int64_t* geometry, int64_t b0, int64_t b1, const T* planes, const T* kernels,
                    int64_t* where) {
    const Geometry g(geometry);
    for (int64_t b = b0; b < b1; ++b)
        for (int64_t ch = 0; ch < g.c * g.h; ++ch) {
            const T* plane = planes + (b * g.c * g.h + ch) * g.plane();
            const T* w = kernels + ch * g.taps() * g.qp;
            int64_t* out = where + (b * g.c * g.h + ch) * g.q;
            for (int64_t q0 = 0; q0 < g.qp; q0 += BLOCK) {
                T best[BLOCK];
                int64_t arg[BLOCK];
                for (int j = 0; j < BLOCK; ++j) best[j] = -std::numeric_limits<T>::infinity(), arg[j] = 0;
                for (int64_t x = 0; x < g.out_x; ++x)
                    over_row<4>(g, [&]<int n>(int64_t y0) {
                        T acc[n][BLOCK];
                        respond<n>(g, plane + g.origin(x, y0), g.stride, w + q0, acc);
                        for (int i = 0; i < n; ++i)  // in position order: ties keep the first
                            for (int j = 0; j < BLOCK; ++j)
                                if (acc[i][j] > best[j]) best[j] = acc[i][j], arg[j] = x * g.out_y + y0 + i;
                    });
                for (int64_t j = 0; j < BLOCK && q0 + j < g.q; ++j) out[q0 + j] = arg[j];
            }
        }
}

// With per-sample filters W = alpha_c K: total = sum_c f~, peak = max_c f~ and its c.
// total, peak, winner: (B, X', Y', H, Q). (Tiling positions as in spatial_argmax made this
// loop slower with gcc 12: 70-110 ms against 52 ms on the a_p4cnn layer 2 benchmark.)
template <typename T>
void attended_max_forward(const int64_t* geometry, int64_t b0, int64_t b1, const T* planes, const T* weights,
                          T* total, T* peak, uint8_t* winner) {
    const Geometry g(geometry);
    for (int64_t b = b0; b < b1; ++b)
        for (int64_t h = 0; h < g.h; ++h)  // the filters of one h stay in the L1 cache
            for (int64_t x = 0; x < g.out_x; ++x)
                for (int64_t y = 0; y < g.out_y; ++y) {
                    const int64_t at = ((b * g.positions() + x * g.out_y + y) * g.h + h) * g.q;
                    for (int64_t q0 = 0; q0 < g.qp; q0 += BLOCK) {
                        T sum[BLOCK], best[BLOCK], acc[1][BLOCK];
                        uint8_t win[BLOCK];
                        for (int j = 0; j < BLOCK; ++j)
                            sum[j] = 0, best[j] = -std::numeric_limits<T>::infinity(), win[j] = 0;
                        for (int64_t c = 0; c < g.c; ++c) {
                            const int64_t ch = (b * g.c + c) * g.h + h;
                            respond<1>(g, planes + ch * g.plane() + g.origin(x, y), 0,
                                       weights + ch * g.taps() * g.qp + q0, acc);
                            for (int j = 0; j < BLOCK; ++j) {
                                sum[j] += acc[0][j];
                                if (acc[0][j] > best[j]) best[j] = acc[0][j], win[j] = static_cast<uint8_t>(c);
                            }
                        }
                        for (int64_t j = 0; j < BLOCK && q0 + j < g.q; ++j)
                            total[at + q0 + j] = sum[j], peak[at + q0 + j] = best[j], winner[at + q0 + j] = win[j];
                    }
                }
}

// Gradients of attended_max_forward: every f~ term gets grad_total, the winning one also
// grad_peak. Adds into grad_planes (B, C, H, Xp, Yp) and grad_weights (B, C, H, k * k, Qp).
template <typename T>
void attended_max_backward(const int64_t* geometry, int64_t b0, int64_t b1, const T* planes, const T* weights,
                           const T* grad_total, const T* grad_peak, const uint8_t* winner, T* grad_planes,
                           T* grad_weights) {
    const Geometry g(geometry);
    const int64_t taps = g.taps();
    std::vector<T> gt(g.qp), gp(g.qp), e(g.qp);
    std::vector<int> win(g.qp);
    for (int64_t b = b0; b < b1; ++b)
        for (int64_t h = 0; h < g.h; ++h)
            for (int64_t x = 0; x < g.out_x; ++x)
                for (int64_t y = 0; y < g.out_y; ++y) {
                    const int64_t at = ((b * g.positions() + x * g.out_y + y) * g.h + h) * g.q;
                    for (int64_t j = 0; j < g.qp; ++j) {
                        const bool real = j < g.q;
                        gt[j] = real ? grad_total[at + j] : T(0);
                        gp[j] = real ? grad_peak[at + j] : T(0);
                        win[j] = real ? winner[at + j] : -1;
                    }
                    for (int64_t c = 0; c < g.c; ++c) {
                        const int64_t ch = (b * g.c + c) * g.h + h;
                        const int64_t first = ch * g.plane() + g.origin(x, y);
                        const T* w = weights + ch * taps * g.qp;
                        T* dw = grad_weights + ch * taps * g.qp;
                        for (int64_t j = 0; j < g.qp; ++j) e[j] = gt[j] + (win[j] == c ? gp[j] : T(0));
                        // dw[t, q] += e[q] p[t], and grad_planes[t] += sum_q e[q] w[t, q] as BLOCK
                        // partial sums, so that each tap needs one horizontal sum.
                        for (int64_t t = 0; t < taps; ++t) {
                            const T p = planes[first + g.tap[t]];
                            const T* wt = w + t * g.qp;
                            T* dwt = dw + t * g.qp;
                            T dot[BLOCK] = {};
                            for (int64_t q0 = 0; q0 < g.qp; q0 += BLOCK)
#pragma omp simd
                                for (int j = 0; j < BLOCK; ++j) {
                                    dwt[q0 + j] += e[q0 + j] * p;
                                    dot[j] += e[q0 + j] * wt[q0 + j];
                                }
                            T sum = 0;
#pragma omp simd reduction(+ : sum)
                            for (int j = 0; j < BLOCK; ++j) sum += dot[j];
                            grad_planes[first + g.tap[t]] += sum;
                        }
                    }
                }
}

// Weight gradient of a depthwise convolution with stride 1 and padding that keeps the
// size, on channels-last tensors: out[t, ch] += sum_{b, x} grad[b, x, ch] input[b, x + tap t, ch].
// input, grad: (B, X, Y, CH); out: (k * k, CH); geometry {X, Y, CH, k, padding, dilation}.
// oneDNN runs this at a fraction of the speed of the forward convolution; here each row of
// grad meets the k * k shifted input rows while they are in cache, vectorised over channels.
template <typename T>
void depthwise_weight_grad(const int64_t* geometry, int64_t b0, int64_t b1, const T* input, const T* grad, T* out) {
    const int64_t size_x = geometry[0], size_y = geometry[1], channels = geometry[2], k = geometry[3];
    const int64_t padding = geometry[4], dilation = geometry[5];
    constexpr int64_t CB = 32;  // channels per block: four independent vector chains
    for (int64_t b = b0; b < b1; ++b)
        for (int64_t x = 0; x < size_x; ++x)
            for (int64_t u = 0; u < k; ++u) {
                const int64_t xi = x + u * dilation - padding;
                if (xi < 0 || xi >= size_x) continue;
                for (int64_t v = 0; v < k; ++v) {
                    const int64_t dy = v * dilation - padding;
                    const int64_t y0 = dy < 0 ? -dy : 0, y1 = dy > 0 ? size_y - dy : size_y;
                    const T* g = grad + ((b * size_x + x) * size_y) * channels;
                    const T* in = input + ((b * size_x + xi) * size_y + dy) * channels;
                    T* o = out + (u * k + v) * channels;
                    for (int64_t c0 = 0; c0 < channels; c0 += CB) {
                        const int64_t n = channels - c0 < CB ? channels - c0 : CB;
                        T acc[CB] = {};
                        for (int64_t y = y0; y < y1; ++y) {
                            const T* gy = g + y * channels + c0;
                            const T* iy = in + y * channels + c0;
#pragma omp simd
                            for (int64_t j = 0; j < n; ++j) acc[j] += gy[j] * iy[j];
                        }
                        for (int64_t j = 0; j < n; ++j) o[c0 + j] += acc[j];
                    }
                }
            }
}

}  // namespace

// C entry points for ctypes, one per kernel and dtype (f32, f64).
#define AAGC_EXPORT(T, suffix)                                                                                   \
    extern "C" void spatial_argmax_##suffix(const int64_t* g, int64_t b0, int64_t b1, const T* p, const T* k,   \
                                            int64_t* where) {                                                  \
        spatial_argmax<T>(g, b0, b1, p, k, where);                                                             \
    }                                                                                                          \
    extern "C" void attended_max_forward_##suffix(const int64_t* g, int64_t b0, int64_t b1, const T* p,         \
                                                  const T* w, T* total, T* peak, uint8_t* winner) {            \
        attended_max_forward<T>(g, b0, b1, p, w, total, peak, winner);                                         \
    }                                                                                                          \
    extern "C" void attended_max_backward_##suffix(const int64_t* g, int64_t b0, int64_t b1, const T* p,        \
                                                   const T* w, const T* gt, const T* gp, const uint8_t* winner, \
                                                   T* dp, T* dw) {                                             \
        attended_max_backward<T>(g, b0, b1, p, w, gt, gp, winner, dp, dw);                                     \
    }                                                                                                          \
    extern "C" void depthwise_weight_grad_##suffix(const int64_t* g, int64_t b0, int64_t b1, const T* input,    \
                                                   const T* grad, T* out) {                                    \
        depthwise_weight_grad<T>(g, b0, b1, input, grad, out);                                                 \
    }

AAGC_EXPORT(float, f32)
AAGC_EXPORT(double, f64)
