// CPU kernels for the full attentive convolution's statistics, never storing f~.
//
// f~(b, q, c, h, x) = sum_t P(b, c, h, x + t) K(q, c, h, t) is the response of input
// plane (c, h) to filter q = (o, g) at output position x, t running over the k * k taps.
// PyTorch has to write f~ out (C_in * G_in times a layer's output) before it can reduce
// it; these loops reduce each value as soon as it is computed.
//
// Layouts (all contiguous, row-major):
//   planes   P  (B, C, H, Xp, Yp)   input already padded
//   kernels  K  (C, H, k * k, Q)
//   channel attention alpha (B, C, H, Q)
//   per-position outputs (B, X', Y', H, Q): channels last, as full_attentive_conv.py keeps them
// geometry: {C, H, Xp, Yp, X', Y', k, stride, dilation, Q}, Q >= LANES (the caller pads)
//
// Vectors run over LANES filters (GCC/Clang vector extensions), LANES chosen for the instruction set
// the library is built for: one AVX-512 register (16 floats), one AVX2 register (8), one NEON or SSE
// register (4). A vector wider than the machine's registers is split into several by the compiler,
// and the register tiles below, sized for 32 AVX-512 registers, then spill: built with 16 lanes for
// AVX2, a_p4cnn's training step took 7.7x as long as with 16 lanes on AVX-512 (one thread, same
// machine) and 1.8x as long as PyTorch's path. Where Q is not a multiple of LANES, the last
// block starts at Q - LANES and overlaps the one before; forward results are then written
// twice with equal values, and gradients mask the overlap out. Each loop keeps a small tile
// of independent accumulators (positions x filter blocks) in registers: one chain of
// multiply-adds per tap would wait on its own latency. Ties go to the first maximum
// (lowest c or position), like torch.max. Each thread runs a kernel over its share [b0, b1) of
// the batch, or of the (b, h) pairs [i0, i1) (see split below).

#include <cmath>
#include <cstdint>
#include <algorithm>
#include <cstring>
#include <limits>
#include <omp.h>
#include <type_traits>
#include <utility>
#include <vector>

namespace {

#if defined(__AVX512F__)
constexpr int LANES = 16, REGISTERS = 32;
#elif defined(__AVX__)
constexpr int LANES = 8, REGISTERS = 16;
#elif defined(__aarch64__)
constexpr int LANES = 4, REGISTERS = 32;
#else
constexpr int LANES = 4, REGISTERS = 16;
#endif

// Vector types of one dtype, and its register tiles: filter blocks and positions of f~ in the argmax
// and the forward loop, filter blocks and taps in the weight gradient, positions in the gathered
// input gradient, positions in the depthwise convolutions (the pair, with one or two accumulators
// per position, and one input with two filters).
template <typename T, typename Lane, int ARGMAX_BLOCKS, int POSITIONS, int GRADIENT_BLOCKS,
          int TAPS, int GATHER, int PAIR_POSITIONS, int PAIR_CHAINS, int SPLIT_POSITIONS>
struct Lanes {
    static constexpr int argmax_blocks = ARGMAX_BLOCKS, positions = POSITIONS, gradient_blocks = GRADIENT_BLOCKS,
                         taps = TAPS, gather = GATHER, pair_positions = PAIR_POSITIONS, pair_chains = PAIR_CHAINS,
                         split_positions = SPLIT_POSITIONS;
    typedef Lane lane;
    typedef T type __attribute__((vector_size(LANES * sizeof(T))));
    typedef Lane index __attribute__((vector_size(LANES * sizeof(T))));
};
// 32 registers (AVX-512, NEON): float fills them (3 filter blocks x 9 taps). The argmax runs fastest
// with 6 positions (1.7x faster than 4 on a_p4cnn's second layer). 16 registers (AVX2, SSE): two
// filter blocks of 4 positions in the argmax and the forward loop (14 registers), one block of 9
// taps in the weight gradient (10), 8 positions in the gather (10), 6 positions of the depthwise
// pair with two accumulators each (12 chains of multiply-adds; its 14 weights come from memory
// operands): with one accumulator per position, 4 positions, the pair's 7x7 forward waited on the
// multiply-adds' latency and took 1.31x as long on a_p4cnn's second layer (9.53 against 7.28 ms,
// 16 samples, one thread, AVX2 code on a Xeon, benchmarks.depthwise_pair); on 32 registers two
// accumulators per position spill (about 1.1x slower in one run). float64 (for tests; a vector of
// it takes two registers) runs untiled, which keeps the build short, except for the gather (so that
// the tests cover its lane sums) and 4 positions in the argmax and the forward loop (14 registers):
// one position there left a single chain of multiply-adds waiting on its own latency, and
// a_p4m_allcnnc's float64 equivariance test ran 1.4x longer. Wider float64 tiles ran slower.
template <typename T>
struct Vec;
template <>
struct Vec<float> : std::conditional_t<REGISTERS == 32, Lanes<float, int32_t, 3, 6, 3, 9, LANES, 8, 1, 6>,
                                       Lanes<float, int32_t, 2, 4, 1, 9, LANES, 6, 2, 4>> {};
template <>
struct Vec<double> : Lanes<double, int64_t, 1, 4, 1, 1, LANES, 4, 1, 4> {};
template <typename T>
using V = typename Vec<T>::type;
template <typename T>
using Index = typename Vec<T>::index;  // lane-wise integers (channel or position), same lane count
typedef uint8_t Bytes __attribute__((vector_size(LANES)));

// Unaligned loads and stores (memcpy compiles to one vector move).
template <typename Vector, typename S>
inline Vector load(const S* p) {
    Vector v;
    std::memcpy(&v, p, sizeof v);
    return v;
}
template <typename Vector, typename S>
inline void store(S* p, const Vector& v) {
    std::memcpy(p, &v, sizeof v);
}

// The sum of v's lanes, by halves (the order of the lane-folding reduction below).
template <typename T>
inline T horizontal_sum(const V<T>& v) {
    T lanes[LANES];
    std::memcpy(lanes, &v, sizeof lanes);
    for (int width = LANES / 2; width >= 1; width /= 2)
        for (int i = 0; i < width; ++i) lanes[i] += lanes[i + width];
    return lanes[0];
}

struct Geometry {
    int64_t c, h, xp, yp, out_x, out_y, k, stride, dilation, q;
    std::vector<int64_t> tap;    // offset of each filter tap from a patch's first one, in a plane
    std::vector<int64_t> start;  // first filter of each block of LANES
    int64_t overlap;             // lanes of the last block that the block before already covers

    explicit Geometry(const int64_t* g)
        : c(g[0]), h(g[1]), xp(g[2]), yp(g[3]), out_x(g[4]), out_y(g[5]), k(g[6]), stride(g[7]),
          dilation(g[8]), q(g[9]), tap(k * k) {
        // Precomputed: an integer division per tap costs more than its multiply-adds.
        for (int64_t t = 0; t < k * k; ++t) tap[t] = (t / k) * dilation * yp + (t % k) * dilation;
        for (int64_t s = 0; s + LANES <= q; s += LANES) start.push_back(s);
        overlap = q % LANES ? start.back() + LANES - (q - LANES) : 0;
        if (overlap) start.push_back(q - LANES);
    }
    int64_t taps() const { return k * k; }
    int64_t plane() const { return xp * yp; }
    int64_t positions() const { return out_x * out_y; }
    int64_t blocks() const { return static_cast<int64_t>(start.size()); }
    // Offset of output position (x, y)'s first tap in a plane.
    int64_t origin(int64_t x, int64_t y) const { return x * stride * yp + y * stride; }
};

// Calls body.template operator()<NB>(first block) over the filter blocks in tiles of up to MB.
template <int MB, typename Body>
inline void over_blocks(const Geometry& g, Body&& body) {
    int64_t j = 0;
    for (; j + MB <= g.blocks(); j += MB) body.template operator()<MB>(j);
    if constexpr (MB >= 3)
        if (g.blocks() - j == 2) body.template operator()<2>(j);
    if constexpr (MB >= 2)
        if (g.blocks() - j == 1) body.template operator()<1>(j);
}

// Calls body.template operator()<n>(y0) for output columns y0 .. y0 + n - 1 covering one row:
// tiles of TILE, then at most one of TILE / 2, then single positions.
template <int TILE, typename Body>
inline void over_row(const Geometry& g, Body&& body) {
    int64_t y0 = 0;
    for (; y0 + TILE <= g.out_y; y0 += TILE) body.template operator()<TILE>(y0);
    if constexpr (TILE >= 4)
        if (y0 + TILE / 2 <= g.out_y) {
            body.template operator()<TILE / 2>(y0);
            y0 += TILE / 2;
        }
    for (; y0 < g.out_y; ++y0) body.template operator()<1>(y0);
}

// acc[i][j] = f~ of one plane at P neighbouring output positions (step apart in the plane)
// for filter blocks j0 .. j0 + NB - 1; w points at the plane's (k * k, Q) filters.
template <int P, int NB, typename T>
inline void respond(const Geometry& g, const T* __restrict__ patch, int64_t step, const T* __restrict__ w,
                    int64_t j0, V<T> (&acc)[P][NB]) {
    for (int i = 0; i < P; ++i)
        for (int j = 0; j < NB; ++j) acc[i][j] = V<T>{};
    for (int64_t t = 0; t < g.taps(); ++t) {
        V<T> wt[NB];
        for (int j = 0; j < NB; ++j) wt[j] = load<V<T>>(w + t * g.q + g.start[j0 + j]);
        for (int i = 0; i < P; ++i) {
            const T p = patch[i * step + g.tap[t]];
            for (int j = 0; j < NB; ++j) acc[i][j] += p * wt[j];
        }
    }
}

// respond for 3 x 3 filters with stride and dilation 1 (every full attention layer of the paper's
// networks but the last): the taps' offsets are known when compiling, so each load takes a constant
// displacement from one of three row pointers instead of an address computed per tap and position.
// Same taps in the same order, so the same sums.
template <int P, int NB, typename T>
inline void respond_3x3(const Geometry& g, const T* __restrict__ patch, const T* __restrict__ w, int64_t j0,
                        V<T> (&acc)[P][NB]) {
    for (int i = 0; i < P; ++i)
        for (int j = 0; j < NB; ++j) acc[i][j] = V<T>{};
    for (int u = 0; u < 3; ++u) {
        const T* row = patch + u * g.yp;
        for (int v = 0; v < 3; ++v) {
            V<T> wt[NB];
            for (int j = 0; j < NB; ++j) wt[j] = load<V<T>>(w + (u * 3 + v) * g.q + g.start[j0 + j]);
            for (int i = 0; i < P; ++i) {
                const T p = row[i + v];
                for (int j = 0; j < NB; ++j) acc[i][j] += p * wt[j];
            }
        }
    }
}

// respond, through respond_3x3 where it applies: float only (in float64, whose vectors take two registers
// each, the unrolled taps of 4 positions ran 1.3x slower than respond's loop, a_p4m_allcnnc's forward pass).
template <int P, int NB, typename T>
inline void respond_any(const Geometry& g, const T* __restrict__ patch, const T* __restrict__ w, int64_t j0,
                        V<T> (&acc)[P][NB]) {
    if constexpr (std::is_same_v<T, float>)
        if (g.k == 3 && g.stride == 1 && g.dilation == 1) return respond_3x3<P, NB>(g, patch, w, j0, acc);
    respond<P, NB>(g, patch, g.stride, w, j0, acc);
}

// The max over positions of each f~(b, ., c, h, .) and where it lies (the first maximum):
// value, where (B, C, H, Q); where in 32 bits, kept for the backward pass at half the memory.
template <typename T>
void spatial_max(const int64_t* geometry, int64_t b0, int64_t b1, const T* planes, const T* kernels, T* value,
                 int32_t* where) {
    const Geometry g(geometry);
    using Lane = typename Vec<T>::lane;
    for (int64_t b = b0; b < b1; ++b)
        for (int64_t ch = 0; ch < g.c * g.h; ++ch) {
            const T* plane = planes + (b * g.c * g.h + ch) * g.plane();
            const T* w = kernels + ch * g.taps() * g.q;
            const int64_t at = (b * g.c * g.h + ch) * g.q;
            over_blocks<Vec<T>::argmax_blocks>(g, [&]<int NB>(int64_t j0) {
                V<T> best[NB];
                Index<T> arg[NB];
                for (int j = 0; j < NB; ++j) best[j] = V<T>{} - std::numeric_limits<T>::infinity(), arg[j] = Index<T>{};
                for (int64_t x = 0; x < g.out_x; ++x)
                    over_row<Vec<T>::positions>(g, [&]<int P>(int64_t y0) {
                        V<T> acc[P][NB];
                        respond_any<P, NB>(g, plane + g.origin(x, y0), w, j0, acc);
                        for (int i = 0; i < P; ++i) {  // in position order: ties keep the first
                            const Lane position = static_cast<Lane>(x * g.out_y + y0 + i);
                            for (int j = 0; j < NB; ++j) {
                                const auto better = acc[i][j] > best[j];
                                best[j] = better ? acc[i][j] : best[j];
                                arg[j] = better ? Index<T>{} + position : arg[j];
                            }
                        }
                    });
                for (int j = 0; j < NB; ++j) {
                    store(value + at + g.start[j0 + j], best[j]);
                    for (int l = 0; l < LANES; ++l) where[at + g.start[j0 + j] + l] = arg[j][l];
                }
            });
        }
}

// Gradients of spatial_max's value, which is f~ at one position: they touch that patch only.
// Adds into grad_planes (B, C, H, Xp, Yp) and grad_kernels (C, H, k * k, Q), the latter
// private to the calling thread. Scalar loops: there are k * k terms per (b, c, h, q).
template <typename T>
void spatial_max_backward(const int64_t* geometry, int64_t b0, int64_t b1, const T* planes, const T* kernels,
                          const int32_t* where, const T* grad, T* grad_planes, T* grad_kernels) {
    const Geometry g(geometry);
    for (int64_t b = b0; b < b1; ++b)
        for (int64_t ch = 0; ch < g.c * g.h; ++ch) {
            const T* plane = planes + (b * g.c * g.h + ch) * g.plane();
            T* dp = grad_planes + (b * g.c * g.h + ch) * g.plane();
            const T* w = kernels + ch * g.taps() * g.q;
            T* dw = grad_kernels + ch * g.taps() * g.q;
            const int64_t at = (b * g.c * g.h + ch) * g.q;
            for (int64_t q = 0; q < g.q; ++q) {
                const T e = grad[at + q];
                const int64_t position = where[at + q];
                const int64_t first = g.origin(position / g.out_y, position % g.out_y);
                for (int64_t t = 0; t < g.taps(); ++t) {
                    dp[first + g.tap[t]] += e * w[t * g.q + q];
                    dw[t * g.q + q] += e * plane[first + g.tap[t]];
                }
            }
        }
}

// The filters of sample b and input orientation h weighted by the channel attention,
// W(c, t, q) = alpha(b, c, h, q) K(c, h, t, q) (alpha = 1 where `channel` is null): (C, k * k, Q).
// channel: (B, C, H, Q).
template <typename T>
void fold_channel_attention(const Geometry& g, const T* kernels, const T* channel, int64_t b, int64_t h, T* out) {
    for (int64_t c = 0; c < g.c; ++c) {
        const T* k = kernels + (c * g.h + h) * g.taps() * g.q;
        const T* alpha = channel ? channel + ((b * g.c + c) * g.h + h) * g.q : nullptr;
        T* w = out + c * g.taps() * g.q;
        for (int64_t t = 0; t < g.taps(); ++t)
#pragma omp simd
            for (int64_t j = 0; j < g.q; ++j) w[t * g.q + j] = alpha ? alpha[j] * k[t * g.q + j] : k[t * g.q + j];
    }
}

// With the filters W = alpha_c K of sample b: total = sum_c f~, peak = max_c f~ and its c, for
// input orientation h. total, peak, winner point at sample b's (X', Y', H, Q) block; folded
// holds C * k * k * Q values. Row by row: f~ of one channel at a tile of positions x filter blocks
// (respond, with the argmax's register tile), added into the row's running sums, maxima and winners,
// which are kept per filter block (overlapping blocks each keep their own copy) and stored once the
// channels are done. The channels go in order and each f~ sums its taps in order: the same additions as
// reducing one position at a time over the channels, which ran 1.3-1.4x slower on AVX2 (a_p4cnn's second
// layer; 16 registers hold the sum, max and winner of only a few filter blocks, leaving too few
// independent multiply-adds).
template <typename T>
void attended_max_item(const Geometry& g, int64_t b, int64_t h, const T* planes, const T* kernels, const T* channel,
                       T* total, T* peak, uint8_t* winner, T* folded) {
    using Lane = typename Vec<T>::lane;
    const int64_t plane_step = g.h * g.plane(), weight_step = g.taps() * g.q, blocks = g.blocks();
    const T* planes_bh = planes + (b * g.c * g.h + h) * g.plane();
    fold_channel_attention(g, kernels, channel, b, h, folded);  // the filters of one h stay in the L1 cache
    std::vector<V<T>> sum(g.out_y * blocks), best(g.out_y * blocks);  // (Y', blocks) of the current row
    std::vector<Index<T>> win(g.out_y * blocks);
    for (int64_t x = 0; x < g.out_x; ++x) {
        std::fill(sum.begin(), sum.end(), V<T>{});
        std::fill(best.begin(), best.end(), V<T>{} - std::numeric_limits<T>::infinity());
        std::fill(win.begin(), win.end(), Index<T>{});
        // A tile of filter blocks at a time, so that the running values it updates stay in the L1 cache
        // however many filters the layer has.
        over_blocks<Vec<T>::argmax_blocks>(g, [&]<int NB>(int64_t j0) {
            for (int64_t c = 0; c < g.c; ++c) {  // in order: ties keep the first
                const T* plane = planes_bh + c * plane_step;
                const T* w = folded + c * weight_step;
                const Index<T> tag = Index<T>{} + static_cast<Lane>(c);
                over_row<Vec<T>::positions>(g, [&]<int P>(int64_t y0) {
                    V<T> acc[P][NB];
                    respond_any<P, NB>(g, plane + g.origin(x, y0), w, j0, acc);
                    for (int i = 0; i < P; ++i)
                        for (int j = 0; j < NB; ++j) {
                            const int64_t at = (y0 + i) * blocks + j0 + j;
                            sum[at] += acc[i][j];
                            const auto better = acc[i][j] > best[at];
                            best[at] = better ? acc[i][j] : best[at];
                            win[at] = better ? tag : win[at];
                        }
                });
            }
        });
        for (int64_t y = 0; y < g.out_y; ++y)
            for (int64_t j = 0; j < blocks; ++j) {
                const int64_t o = ((x * g.out_y + y) * g.h + h) * g.q + g.start[j], at = y * blocks + j;
                store(total + o, sum[at]);
                store(peak + o, best[at]);
                store(winner + o, __builtin_convertvector(win[at], Bytes));
            }
    }
}

// The backward pass of attended_max_forward works on one (b, h) and input channel c at a time,
// from the gradient reaching each f~(b, ., c, h, x): grad_total, plus grad_peak where c won.
// errors_of_channels writes it for every output position and a group of channels, each into a
// buffer with a zero border of m = (k - 1) * dilation positions on each side: the gather below
// then reads the border as "no output position there" instead of checking bounds. The buffer
// holds the filter blocks one after another within each row, (out_x + 2m, blocks, out_y + 2m,
// LANES), so that neighbouring positions of one block lie LANES values apart and the tiles below
// read them at constant offsets from one pointer. (With a position's Q filters together, each
// load's address took an instruction of its own, a runtime multiple of Q: this backward pass ran
// 1.06-1.14x longer on AVX2 code and 1.14-1.16x on AVX-512, a_p4cnn's second layer.) Where Q is
// not a multiple of LANES the last block overlaps the one before and holds the overlap's values
// again; the passes mask it. Grouping the channels reads grad_total, grad_peak and the winners
// once per group; the buffer's writes cost about a quarter of the backward pass all the same.
constexpr int64_t ERROR_GROUP_BYTES = 1 << 20;
struct ErrorLayout {
    int64_t margin, width, blocks;  // border, the buffer's row length in positions, filter blocks
    explicit ErrorLayout(const Geometry& g)
        : margin((g.k - 1) * g.dilation), width(g.out_y + 2 * margin), blocks(g.blocks()) {}
    int64_t size(const Geometry& g) const { return (g.out_x + 2 * margin) * blocks * width * LANES; }
    // From one block of a row to the next.
    int64_t block_step() const { return width * LANES; }
    // Position (x, y)'s values of filter block j.
    int64_t at(int64_t x, int64_t j, int64_t y) const {
        return (((x + margin) * blocks + j) * width + y + margin) * LANES;
    }
};

template <typename T>
void errors_of_channels(const Geometry& g, const ErrorLayout& layout, const T* gt, const T* gp, const uint8_t* win,
                        int64_t c0, int64_t c1, T* errors) {
    using Lane = typename Vec<T>::lane;
    const int64_t row = g.h * g.q, size = layout.size(g);
    for (int64_t x = 0; x < g.out_x; ++x)
        for (int64_t y = 0; y < g.out_y; ++y) {
            const int64_t from = (x * g.out_y + y) * row;
            for (int64_t j = 0; j < g.blocks(); ++j) {
                const int64_t s = from + g.start[j];
                const V<T> total = load<V<T>>(gt + s), both = total + load<V<T>>(gp + s);
                const Index<T> winner = __builtin_convertvector(load<Bytes>(win + s), Index<T>);
                T* to = errors + layout.at(x, j, y);
                for (int64_t c = c0; c < c1; ++c)
                    store(to + (c - c0) * size, winner == static_cast<Lane>(c) ? both : total);
            }
        }
}

// Weight gradient, dW[t, q] = sum_x P[x + t] e[x, q], for a tile of NT taps and NB filter blocks
// whose sums stay in registers while the output positions go by.
template <int NT, int NB, typename T>
inline void weight_grad_tile(const Geometry& g, const ErrorLayout& layout, const T* plane, const T* errors,
                             int64_t t0, int64_t j0, const V<T>& keep_last, T* dw) {
    V<T> acc[NT][NB] = {};
    for (int64_t x = 0; x < g.out_x; ++x)
        for (int64_t y = 0; y < g.out_y; ++y) {
            const T* e_at = errors + layout.at(x, j0, y);
            const int64_t first = g.origin(x, y);
            V<T> e[NB];
            for (int j = 0; j < NB; ++j) e[j] = load<V<T>>(e_at + j * layout.block_step());
            for (int t = 0; t < NT; ++t) {
                const T p = plane[first + g.tap[t0 + t]];
                for (int j = 0; j < NB; ++j) acc[t][j] += p * e[j];
            }
        }
    for (int t = 0; t < NT; ++t)
        for (int j = 0; j < NB; ++j) {
            const V<T> sum = j0 + j == g.blocks() - 1 ? acc[t][j] * keep_last : acc[t][j];
            T* to = dw + (t0 + t) * g.q + g.start[j0 + j];
            store(to, load<V<T>>(to) + sum);
        }
}

// Input gradient with stride > 1, dP[x + t] += sum_q e[x, q] W[t, q]: scattered from each output
// position, a horizontal sum per position and tap, with W of NT taps held in registers. w: the
// blocked filters of one channel (AttendedMaxBackward::block_filters).
template <int NT, int NB, typename T>
inline void input_grad_scatter_tile(const Geometry& g, const ErrorLayout& layout, const T* w, const T* errors,
                                    int64_t t0, int64_t j0, T* dp) {
    V<T> wt[NT][NB];
    for (int t = 0; t < NT; ++t)
        for (int j = 0; j < NB; ++j) wt[t][j] = load<V<T>>(w + ((t0 + t) * g.blocks() + j0 + j) * LANES);
    for (int64_t x = 0; x < g.out_x; ++x)
        for (int64_t y = 0; y < g.out_y; ++y) {
            const T* e_at = errors + layout.at(x, j0, y);
            const int64_t first = g.origin(x, y);
            for (int t = 0; t < NT; ++t) {
                V<T> dot = load<V<T>>(e_at) * wt[t][0];
                for (int j = 1; j < NB; ++j) dot += load<V<T>>(e_at + j * layout.block_step()) * wt[t][j];
                dp[first + g.tap[t0 + t]] += horizontal_sum<T>(dot);
            }
        }
}

// Halves each group of W lanes of a and of b and adds the halves: the result holds, group by
// group, the folded groups of a and then of b. log2(LANES) such levels (W = LANES, ..., 2) reduce
// LANES vectors to one vector of their lane sums, in bit-reversed order.
template <int W>
constexpr int fold_index(int lane, bool upper) {  // the source lane (of a, or LANES + that of b)
    const int group = lane / W, within = lane % W, half = W / 2;
    return (within < half ? 0 : LANES) + group * W + within % half + (upper ? half : 0);
}
template <int W, typename T, int... I>
inline V<T> fold_lanes(const V<T>& a, const V<T>& b, std::integer_sequence<int, I...>) {
    return __builtin_shufflevector(a, b, fold_index<W>(I, false)...) +
           __builtin_shufflevector(a, b, fold_index<W>(I, true)...);
}
template <int W, typename T>
inline V<T> fold(const V<T>& a, const V<T>& b) {
    return fold_lanes<W, T>(a, b, std::make_integer_sequence<int, LANES>{});
}

constexpr int log2_of(int n) { return n > 1 ? 1 + log2_of(n / 2) : 0; }

constexpr int bit_reversed(int i, int bits) {
    int r = 0;
    for (int b = 0; b < bits; ++b) r |= ((i >> b) & 1) << (bits - 1 - b);
    return r;
}

// The lane sums of N vectors (N = 1, 2, 4, ..., LANES): lane L of the result holds the sum of
// acc[L / (LANES / N)] (each sum repeated LANES / N times).
template <int N, typename T>
inline V<T> lane_sums(const V<T> (&acc)[N]) {
    constexpr int bits = log2_of(N);
    V<T> v[N];
    for (int i = 0; i < N; ++i) v[i] = acc[bit_reversed(i, bits)];  // so that the sums come out in order
    int count = N;
    auto level = [&]<int W>() {
        if (count == 1) {
            v[0] = fold<W, T>(v[0], v[0]);
            return;
        }
        for (int i = 0; i < count / 2; ++i) v[i] = fold<W, T>(v[2 * i], v[2 * i + 1]);
        count /= 2;
    };
    [&]<int... S>(std::integer_sequence<int, S...>) {
        (level.template operator()<(LANES >> S)>(), ...);  // W = LANES, LANES / 2, ..., 2, in order
    }(std::make_integer_sequence<int, log2_of(LANES)>{});
    return v[0];
}

// Input gradient with stride 1, gathered: dP[y] = sum_t sum_q e[y - t, q] W[t, q] for N
// neighbouring positions y0 .. y0 + N - 1 of row x of the padded plane, the N sums in vector
// registers; their horizontal sums come out together (lane_sums), one vector for all N.
template <int N, typename T>
inline void input_grad_gather_tile(const Geometry& g, const ErrorLayout& layout, const T* w, const T* errors,
                                   int64_t x, int64_t y0, T* dp) {
    V<T> acc[N] = {};
    for (int64_t u = 0; u < g.k; ++u)
        for (int64_t v = 0; v < g.k; ++v) {
            // Position y of the tap's output lies at (x - u d, y - v d), buffer position + margin.
            const T* e_block = errors + layout.at(x - u * g.dilation, 0, y0 - v * g.dilation);
            const T* w_block = w + (u * g.k + v) * g.blocks() * LANES;
            for (int64_t j = 0; j < g.blocks(); ++j, e_block += layout.block_step(), w_block += LANES) {
                const V<T> wt = load<V<T>>(w_block);
                for (int i = 0; i < N; ++i) acc[i] += load<V<T>>(e_block + i * LANES) * wt;
            }
        }
    const V<T> sums = lane_sums<N, T>(acc);
    T* to = dp + x * g.yp + y0;
    if constexpr (N == LANES) {
        store(to, load<V<T>>(to) + sums);
    } else {
        for (int i = 0; i < N; ++i) to[i] += sums[i * (LANES / N)];
    }
}

template <typename T>
inline void input_grad_gather(const Geometry& g, const ErrorLayout& layout, const T* w, const T* errors, T* dp) {
    constexpr int N = Vec<T>::gather;
    for (int64_t x = 0; x < g.xp; ++x) {
        int64_t y = 0;
        for (; y + N <= g.yp; y += N) input_grad_gather_tile<N>(g, layout, w, errors, x, y, dp);
        if constexpr (N >= 16)
            for (; y + 8 <= g.yp; y += 8) input_grad_gather_tile<8>(g, layout, w, errors, x, y, dp);
        if constexpr (N >= 8)
            for (; y + 4 <= g.yp; y += 4) input_grad_gather_tile<4>(g, layout, w, errors, x, y, dp);
        for (; y < g.yp; ++y) input_grad_gather_tile<1>(g, layout, w, errors, x, y, dp);
    }
}

// Taps per register tile: 9 for 3x3 filters, 8 for 4x4, else (or untiled) one at a time.
template <int MT, typename Body>
inline void over_tap_groups(const Geometry& g, Body&& body) {
    const int64_t taps = g.taps();
    if constexpr (MT == 1) {
        for (int64_t t0 = 0; t0 < taps; ++t0) body.template operator()<1>(t0);
    } else if (taps % 9 == 0) {
        for (int64_t t0 = 0; t0 < taps; t0 += 9) body.template operator()<9>(t0);
    } else if (taps % 8 == 0) {
        for (int64_t t0 = 0; t0 < taps; t0 += 8) body.template operator()<8>(t0);
    } else {
        for (int64_t t0 = 0; t0 < taps; ++t0) body.template operator()<1>(t0);
    }
}

// Gradients of attended_max_item for one (b, h): every f~ term gets grad_total, the winning one
// also grad_peak (grad_total, grad_peak, winner: sample b's (X', Y', H, Q) block). Writes the
// planes' share of grad_planes (B, C, H, Xp, Yp); the gradients of W = alpha_c K then reach the
// channel attention, grad_channel (B, C, H, Q) (written, if `channel` is not null), and the
// filters, grad_kernels (C, H, k * k, Q), private to the calling thread (added into).
template <typename T>
class AttendedMaxBackward {
  public:
    explicit AttendedMaxBackward(const Geometry& g)
        : g(g), layout(g), weight_step(g.taps() * g.q), folded(g.c * weight_step),
          blocked(g.c * g.taps() * g.blocks() * LANES), grad_folded(g.c * weight_step),
          group(std::clamp<int64_t>(ERROR_GROUP_BYTES / (layout.size(g) * sizeof(T)), 1, g.c)),
          errors(group * layout.size(g)) {
        for (int l = 0; l < LANES; ++l) keep_last[l] = l < g.overlap ? T(0) : T(1);
    }

    void item(int64_t b, int64_t h, const T* planes, const T* kernels, const T* channel, const T* grad_total,
              const T* grad_peak, const uint8_t* winner, T* grad_planes, T* grad_channel, T* grad_kernels) {
        fold_channel_attention(g, kernels, channel, b, h, folded.data());
        block_filters();
        std::fill(grad_folded.begin(), grad_folded.end(), T(0));
        for (int64_t c = 0; c < g.c; ++c) {
            if (c % group == 0)
                errors_of_channels(g, layout, grad_total + h * g.q, grad_peak + h * g.q, winner + h * g.q, c,
                                   std::min(c + group, g.c), errors.data());
            const T* e = errors.data() + (c % group) * layout.size(g);
            const int64_t ch = (b * g.c + c) * g.h + h;
            const T* plane = planes + ch * g.plane();
            const T* w = blocked.data() + c * g.taps() * g.blocks() * LANES;
            T* dp = grad_planes + ch * g.plane();
            T* dw = grad_folded.data() + c * weight_step;
            over_blocks<Vec<T>::gradient_blocks>(g, [&]<int NB>(int64_t j0) {
                over_tap_groups<Vec<T>::taps>(g, [&]<int NT>(int64_t t0) {
                    weight_grad_tile<NT, NB>(g, layout, plane, e, t0, j0, keep_last, dw);
                });
            });
            std::fill(dp, dp + g.plane(), T(0));
            if (g.stride == 1) {
                input_grad_gather(g, layout, w, e, dp);
            } else {
                over_blocks<Vec<T>::gradient_blocks>(g, [&]<int NB>(int64_t j0) {
                    over_tap_groups<Vec<T>::taps>(g, [&]<int NT>(int64_t t0) {
                        input_grad_scatter_tile<NT, NB>(g, layout, w, e, t0, j0, dp);
                    });
                });
            }
            // dK += alpha dW; d alpha = sum over taps of K dW.
            const T* k = kernels + (c * g.h + h) * weight_step;
            const T* alpha = channel ? channel + ((b * g.c + c) * g.h + h) * g.q : nullptr;
            T* dk = grad_kernels + (c * g.h + h) * weight_step;
            for (int64_t t = 0; t < g.taps(); ++t)
#pragma omp simd
                for (int64_t j = 0; j < g.q; ++j)
                    dk[t * g.q + j] += alpha ? alpha[j] * dw[t * g.q + j] : dw[t * g.q + j];
            if (channel) {
                T* da = grad_channel + ((b * g.c + c) * g.h + h) * g.q;
                std::fill(da, da + g.q, T(0));
                for (int64_t t = 0; t < g.taps(); ++t)
#pragma omp simd
                    for (int64_t j = 0; j < g.q; ++j) da[j] += k[t * g.q + j] * dw[t * g.q + j];
            }
        }
    }

  private:
    // folded (C, k * k, Q) in blocks of filters, (C, k * k, blocks, LANES), the lanes of the last
    // block that the one before covers zeroed: the input gradient's tiles read it in that order.
    void block_filters() {
        for (int64_t ct = 0; ct < g.c * g.taps(); ++ct)
            for (int64_t j = 0; j < g.blocks(); ++j) {
                const V<T> w = load<V<T>>(folded.data() + ct * g.q + g.start[j]);
                store(blocked.data() + (ct * g.blocks() + j) * LANES, j == g.blocks() - 1 ? w * keep_last : w);
            }
    }

    const Geometry& g;
    const ErrorLayout layout;
    const int64_t weight_step;
    std::vector<T> folded, blocked, grad_folded;
    const int64_t group;  // channels whose errors are written at once
    std::vector<T> errors;
    V<T> keep_last;  // 0 on the lanes of the last block that the block before covers
};

// The attended output sum_h a s of the spatial attention a = sigmoid(z) and S, and its
// gradients. a, s, grad_z, grad_s: (B, P, H, Q) (positions first, as the kernels above lay
// S out); out, grad: (B, Q, P), the layout of the convolution's output. geometry {P, H, Q}.
// Memory-bound passes: one read of each input, one write of each output.
template <typename T>
void gated_sum_forward(const int64_t* geometry, int64_t i0, int64_t i1, const T* a, const T* s, T* out) {
    const int64_t positions = geometry[0], h = geometry[1], q = geometry[2];
    std::vector<T> sum(q);
    for (int64_t item = i0; item < i1; ++item) {  // (b, p)
        const int64_t b = item / positions, p = item % positions, at = item * h * q;
        std::fill(sum.begin(), sum.end(), T(0));
        for (int64_t i = 0; i < h * q; i += q)
#pragma omp simd
            for (int64_t j = 0; j < q; ++j) sum[j] += a[at + i + j] * s[at + i + j];
        for (int64_t j = 0; j < q; ++j) out[(b * q + j) * positions + p] = sum[j];
    }
}

template <typename T>
void gated_sum_backward(const int64_t* geometry, int64_t i0, int64_t i1, const T* a, const T* s, const T* grad,
                        T* grad_z, T* grad_s) {
    const int64_t positions = geometry[0], h = geometry[1], q = geometry[2];
    std::vector<T> e(q);
    for (int64_t item = i0; item < i1; ++item) {  // (b, p)
        const int64_t b = item / positions, p = item % positions, at = item * h * q;
        for (int64_t j = 0; j < q; ++j) e[j] = grad[(b * q + j) * positions + p];
        for (int64_t i = 0; i < h * q; i += q)
#pragma omp simd
            for (int64_t j = 0; j < q; ++j) {
                const T gate = a[at + i + j];
                grad_s[at + i + j] = e[j] * gate;
                grad_z[at + i + j] = e[j] * s[at + i + j] * gate * (T(1) - gate);
            }
    }
}

// Blocks of LANES channels out of `channels` (>= LANES): the last one ends at the last channel
// and overlaps the one before on `overlap` lanes.
struct ChannelBlocks {
    std::vector<int64_t> start;
    int64_t overlap;
    explicit ChannelBlocks(int64_t channels) {
        for (int64_t s = 0; s + LANES <= channels; s += LANES) start.push_back(s);
        overlap = channels % LANES ? start.back() + LANES - (channels - LANES) : 0;
        if (overlap) start.push_back(channels - LANES);
    }
};

// Two depthwise convolutions with stride 1 and padding that keeps the size (odd k), on
// channels-last tensors, taps at offsets u * dilation - padding:
//   PAIR (forward):   out1 = w1 * in1 + w2 * in2;
//   one input (their input gradients, with flipped filters): out1 = w1 * in1, out2 = w2 * in1.
// in*, out*: (B, X, Y, CH); w*: (k * k, CH); geometry {X, Y, CH, k, padding, dilation}.
// Each output is gathered whole and written once, so the overlapping channel block and
// overlapping position tiles just write equal values again. A tile of N positions keeps 2N
// independent accumulators in registers; one filter row's weights are loaded per tap.
// Threads share the rows (b, x), B * X of them, [r0, r1), as for the weight gradient below.
template <int K, bool PAIR, typename T>
void depthwise_pair(const int64_t* geometry, int64_t r0, int64_t r1, const T* in1, const T* in2, const T* w1,
                    const T* w2, T* out1, T* out2) {
    const int64_t size_x = geometry[0], size_y = geometry[1], channels = geometry[2];
    const int64_t padding = geometry[4], dilation = geometry[5];
    const ChannelBlocks blocks(channels);
    const int64_t row = size_y * channels;
    auto tile = [&]<int N, bool CHECKED>(int64_t b, int64_t x, int64_t c0, int64_t y0) {
        V<T> acc1[N] = {}, acc2[N] = {};
        for (int u = 0; u < K; ++u) {
            const int64_t xi = x + u * dilation - padding;
            if (xi < 0 || xi >= size_x) continue;
            const T* r1 = in1 + (b * size_x + xi) * row + c0;
            const T* r2 = PAIR ? in2 + (b * size_x + xi) * row + c0 : nullptr;
            for (int v = 0; v < K; ++v) {
                const V<T> wa = load<V<T>>(w1 + (u * K + v) * channels + c0);
                const V<T> wb = load<V<T>>(w2 + (u * K + v) * channels + c0);
                for (int i = 0; i < N; ++i) {
                    const int64_t yi = y0 + i + v * dilation - padding;
                    if (CHECKED && (yi < 0 || yi >= size_y)) continue;
                    const V<T> p = load<V<T>>(r1 + yi * channels);
                    if constexpr (PAIR) {
                        acc1[i] += wa * p;
                        acc2[i] += wb * load<V<T>>(r2 + yi * channels);
                    } else {
                        acc1[i] += wa * p;
                        acc2[i] += wb * p;
                    }
                }
            }
        }
        T* o1 = out1 + (b * size_x + x) * row + y0 * channels + c0;
        T* o2 = PAIR ? nullptr : out2 + (b * size_x + x) * row + y0 * channels + c0;
        for (int i = 0; i < N; ++i) {
            if constexpr (PAIR) {
                store(o1 + i * channels, acc1[i] + acc2[i]);
            } else {
                store(o1 + i * channels, acc1[i]);
                store(o2 + i * channels, acc2[i]);
            }
        }
    };
    // Dilation 1: each input vector of a filter row meets up to K outputs of the tile, so it is
    // loaded once, with the row's K weights (of each filter) held in registers; the pair has one
    // accumulator per position, or two (pair_chains) where the registers allow too few positions
    // to hide the multiply-adds' latency. Loads per multiply-add: 0.45 instead of 1.06 (forward, N = 8).
    auto row_tile = [&]<int N, bool CHECKED>(int64_t b, int64_t x, int64_t c0, int64_t y0) {
        V<T> acc1[N] = {}, acc2[N] = {};
        for (int u = 0; u < K; ++u) {
            const int64_t xi = x + u - padding;
            if (xi < 0 || xi >= size_x) continue;
            const T* r1 = in1 + (b * size_x + xi) * row + c0;
            const T* r2 = PAIR ? in2 + (b * size_x + xi) * row + c0 : nullptr;
            V<T> wa[K], wb[K];
            for (int v = 0; v < K; ++v) {
                wa[v] = load<V<T>>(w1 + (u * K + v) * channels + c0);
                wb[v] = load<V<T>>(w2 + (u * K + v) * channels + c0);
            }
#pragma GCC unroll 16
            for (int s = 0; s < N + K - 1; ++s) {  // input column y0 + s - padding
                const int64_t yi = y0 + s - padding;
                if (CHECKED && (yi < 0 || yi >= size_y)) continue;
                const V<T> p1 = load<V<T>>(r1 + yi * channels);
                const V<T> p2 = PAIR ? load<V<T>>(r2 + yi * channels) : V<T>{};
#pragma GCC unroll 8
                for (int v = 0; v < K; ++v) {
                    const int i = s - v;  // the output it meets through tap v
                    if (i < 0 || i >= N) continue;
                    if constexpr (PAIR && Vec<T>::pair_chains == 1) {
                        acc1[i] += wa[v] * p1;
                        acc1[i] += wb[v] * p2;
                    } else if constexpr (PAIR) {
                        acc1[i] += wa[v] * p1;
                        acc2[i] += wb[v] * p2;
                    } else {
                        acc1[i] += wa[v] * p1;
                        acc2[i] += wb[v] * p1;
                    }
                }
            }
        }
        T* o1 = out1 + (b * size_x + x) * row + y0 * channels + c0;
        T* o2 = PAIR ? nullptr : out2 + (b * size_x + x) * row + y0 * channels + c0;
        for (int i = 0; i < N; ++i) {
            if constexpr (PAIR && Vec<T>::pair_chains == 2) {
                store(o1 + i * channels, acc1[i] + acc2[i]);
            } else {
                store(o1 + i * channels, acc1[i]);
                if constexpr (!PAIR) store(o2 + i * channels, acc2[i]);
            }
        }
    };
    // Tiles of N positions over a row, the last one ending at the row's end; those whose taps
    // can leave the row check each column.
    auto over_row = [&]<int N>(int64_t b, int64_t x, int64_t c0) {
        for (int64_t y0 = 0; y0 < size_y; y0 += N) {
            const int64_t first = y0 + N <= size_y ? y0 : size_y - N;
            const bool inside = first >= padding && first + N - 1 + (K - 1) * dilation - padding < size_y;
            if (dilation == 1 && inside)
                row_tile.template operator()<N, false>(b, x, c0, first);
            else if (dilation == 1)
                row_tile.template operator()<N, true>(b, x, c0, first);
            else if (inside)
                tile.template operator()<N, false>(b, x, c0, first);
            else
                tile.template operator()<N, true>(b, x, c0, first);
        }
    };
    // The widest tile whose registers fit (the one-input pass keeps two accumulators per position).
    // Tiles of 6 (the pair on 16 registers) give way to tiles of 4 where they would cover more than
    // a fifth more positions than the row has: rows of 8 in two tiles of 6 took 1.2x as long. Tiles
    // of 8 (32 registers) stay wherever the row has 8 (on rows of 26, as fast as tiles of 4).
    constexpr int WIDE = PAIR ? Vec<T>::pair_positions : Vec<T>::split_positions;
    const bool wide = size_y >= WIDE && (WIDE % 4 == 0 || 5 * ((size_y + WIDE - 1) / WIDE * WIDE) <= 6 * size_y);
    for (int64_t r = r0; r < r1; ++r)
        for (const int64_t c0 : blocks.start) {
            const int64_t b = r / size_x, x = r % size_x;
            if (wide)
                over_row.template operator()<WIDE>(b, x, c0);
            else if (size_y >= 4)
                over_row.template operator()<4>(b, x, c0);
            else
                over_row.template operator()<1>(b, x, c0);
        }
}

template <bool PAIR, typename T>
void depthwise_pair_k(const int64_t* geometry, int64_t r0, int64_t r1, const T* in1, const T* in2, const T* w1,
                        const T* w2, T* out1, T* out2) {
    switch (geometry[3]) {  // k: 3, 5 or 7; at least LANES channels (the caller checks)
        case 3: return depthwise_pair<3, PAIR>(geometry, r0, r1, in1, in2, w1, w2, out1, out2);
        case 5: return depthwise_pair<5, PAIR>(geometry, r0, r1, in1, in2, w1, w2, out1, out2);
        default: return depthwise_pair<7, PAIR>(geometry, r0, r1, in1, in2, w1, w2, out1, out2);
    }
}

// Weight gradient of a depthwise convolution with stride 1 and padding that keeps the
// size, on channels-last tensors: out[t, ch] += sum_{b, x} grad[b, x, ch] input[b, x + tap t, ch].
// input, grad: (B, X, Y, CH); out: (k * k, CH); geometry {X, Y, CH, k, padding, dilation}.
// oneDNN runs this at a fraction of the speed of the forward convolution. Here, for one
// grad row, filter row u and block of LANES channels, the k sums of the filter row's taps
// stay in registers while the row goes by; each grad vector is loaded once for all k.
template <int K, typename T>
void depthwise_weight_grad_tiled(const int64_t* geometry, int64_t r0, int64_t r1, const T* input, const T* grad,
                                 T* out) {
    const int64_t size_x = geometry[0], size_y = geometry[1], channels = geometry[2];
    const int64_t padding = geometry[4], dilation = geometry[5];
    // The last block leaves out the lanes that the block before covers.
    const ChannelBlocks blocks(channels);
    const std::vector<int64_t>& start = blocks.start;
    V<T> keep_last;
    for (int l = 0; l < LANES; ++l) keep_last[l] = l < blocks.overlap ? T(0) : T(1);
    const int64_t row = size_y * channels;
    for (int64_t r = r0; r < r1; ++r)  // rows (b, x) of the grad
        for (int64_t u = 0; u < K; ++u) {
            const int64_t xi = r % size_x + u * dilation - padding;
            if (xi < 0 || xi >= size_x) continue;
            const T* g = grad + r * row;
            const T* in = input + (r - r % size_x + xi) * row;
            for (size_t j = 0; j < start.size(); ++j) {
                const int64_t c0 = start[j];
                const V<T> keep = j + 1 == start.size() ? keep_last : V<T>{} + T(1);
                V<T> acc[K] = {};
                // Columns where every tap lies inside the row need no bounds checks.
                auto column = [&]<bool checked>(int64_t y) {
                    const V<T> gy = load<V<T>>(g + y * channels + c0) * keep;
                    for (int v = 0; v < K; ++v) {
                        const int64_t yi = y + v * dilation - padding;
                        if (checked && (yi < 0 || yi >= size_y)) continue;
                        acc[v] += gy * load<V<T>>(in + yi * channels + c0);
                    }
                };
                const int64_t inner0 = padding < size_y ? padding : size_y;
                const int64_t inner1 = size_y - padding > inner0 ? size_y - padding : inner0;
                for (int64_t y = 0; y < inner0; ++y) column.template operator()<true>(y);
                for (int64_t y = inner0; y < inner1; ++y) column.template operator()<false>(y);
                for (int64_t y = inner1; y < size_y; ++y) column.template operator()<true>(y);
                for (int v = 0; v < K; ++v) {
                    T* o = out + (u * K + v) * channels + c0;
                    store(o, load<V<T>>(o) + acc[v]);
                }
            }
        }
}

template <typename T>
void depthwise_weight_grad(const int64_t* geometry, int64_t r0, int64_t r1, const T* input, const T* grad, T* out) {
    switch (geometry[3]) {  // k: 3, 5 or 7; at least LANES channels (the caller checks)
        case 3: return depthwise_weight_grad_tiled<3>(geometry, r0, r1, input, grad, out);
        case 5: return depthwise_weight_grad_tiled<5>(geometry, r0, r1, input, grad, out);
        default: return depthwise_weight_grad_tiled<7>(geometry, r0, r1, input, grad, out);
    }
}

// z <- sigmoid(z) = 1 / (1 + exp(-z)), the formula of torch.sigmoid. float: exp after Cephes' expf
// (range reduction by ln 2 in two parts, a degree-5 polynomial), LANES values at a time, the tail
// through a padded vector. Over [-100, 100] the result is within 2.34 ulp of the exact sigmoid
// (torch.sigmoid: 2.48).
inline V<float> exp_of(V<float> x) {
    x = x > 88.0f ? V<float>{} + 88.0f : x;  // exp(88) stays finite after the rounding of n below
    x = x < -87.0f ? V<float>{} - 87.0f : x;  // exp(-87) stays a normal number
    const V<float> shift = V<float>{} + 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
    const V<float> n = (x * 1.44269504088896341f + shift) - shift;
    const V<float> r = x - n * 0.693359375f + n * 2.12194440e-4f;
    V<float> p = V<float>{} + 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    const V<float> y = p * r * r + r + 1.0f;
    const Index<float> scale = (__builtin_convertvector(n, Index<float>) + 127) << 23;  // 2^n
    V<float> two_n;
    std::memcpy(&two_n, &scale, sizeof two_n);
    return y * two_n;
}

inline void sigmoid_in_place(float* z, int64_t n) {
    int64_t i = 0;
    for (; i + LANES <= n; i += LANES) store(z + i, 1.0f / (1.0f + exp_of(-load<V<float>>(z + i))));
    if (i < n) {
        float tail[LANES] = {};
        std::memcpy(tail, z + i, (n - i) * sizeof(float));
        store(tail, 1.0f / (1.0f + exp_of(-load<V<float>>(tail))));
        std::memcpy(z + i, tail, (n - i) * sizeof(float));
    }
}

inline void sigmoid_in_place(double* z, int64_t n) {
    for (int64_t i = 0; i < n; ++i) z[i] = 1.0 / (1.0 + std::exp(-z[i]));
}

// The whole residual attention branch of a full attentive convolution, sample by sample:
//   out = sum_h a S,   a = sigmoid(z),   z = w1 * S + w2 * M   (depthwise, over X' x Y'),
// S and M the sum and max over c of alpha_c f~ (attended_max_item), out (B, Q, X' * Y').
// w1, w2: (k_s * k_s, H * Q), the spatial attention's filter pair of every (h, q) map (w1 also
// carrying the 1 / C of the channel mean). geometry: that of attended_max (10 values), then k_s,
// its padding and dilation. One sample's S, M, a and their gradients (each X' * Y' * H * Q
// values) stay in buffers of the thread, mostly in its L2 cache: nothing the size of the batch is
// written but the output. Where `saved` buffers (B, X', Y', H, Q) are given, S, M, the winners
// and a are kept there for the backward pass, which then reads rather than recomputes them.
// Without spatial attention (w1, w2 null) a = 1: out = sum_h S, whose backward needs no recomputation.
struct Branch {
    Geometry g;
    int64_t spatial[6];  // depthwise geometry {X', Y', H * Q, k_s, padding, dilation}
    int64_t gate[3];     // gated sum geometry {X' * Y', H, Q}
    explicit Branch(const int64_t* geometry)
        : g(geometry),
          spatial{g.out_x, g.out_y, g.h * g.q, geometry[10], geometry[11], geometry[12]},
          gate{g.positions(), g.h, g.q} {}
    int64_t values() const { return g.positions() * g.h * g.q; }  // per sample
};

// S, M, winners and a of sample b into s, m, win, a (sample-sized).
template <typename T>
void branch_statistics(const Branch& br, int64_t b, const T* planes, const T* kernels, const T* channel, const T* w1,
                       const T* w2, T* s, T* m, uint8_t* win, T* a, T* folded) {
    for (int64_t h = 0; h < br.g.h; ++h) attended_max_item(br.g, b, h, planes, kernels, channel, s, m, win, folded);
    if (!w1) {  // no spatial attention: a = 1
        std::fill(a, a + br.values(), T(1));
        return;
    }
    depthwise_pair_k<true, T>(br.spatial, 0, br.g.out_x, s, m, w1, w2, a, nullptr);
    sigmoid_in_place(a, br.values());
}

// Sample b's buffers: the saved ones, or those of the thread.
template <typename T>
struct SampleBuffers {
    T *s, *m, *a;
    uint8_t* win;
};

template <typename T>
SampleBuffers<T> sample_buffers(int64_t n, int64_t b, T* s, T* m, uint8_t* win, T* a, std::vector<T>& own,
                                std::vector<uint8_t>& own_win) {
    if (s) return {s + b * n, m + b * n, a + b * n, win + b * n};
    own.resize(3 * n), own_win.resize(n);
    return {own.data(), own.data() + n, own.data() + 2 * n, own_win.data()};
}

template <typename T>
void branch_forward(const int64_t* geometry, int64_t b0, int64_t b1, const T* planes, const T* kernels,
                    const T* channel, const T* w1, const T* w2, T* out, T* s, T* m, uint8_t* win, T* a) {
    const Branch br(geometry);
    const int64_t n = br.values();
    std::vector<T> folded(br.g.c * br.g.taps() * br.g.q), own;
    std::vector<uint8_t> own_win;
    for (int64_t b = b0; b < b1; ++b) {
        const SampleBuffers<T> x = sample_buffers(n, b, s, m, win, a, own, own_win);
        branch_statistics(br, b, planes, kernels, channel, w1, w2, x.s, x.m, x.win, x.a, folded.data());
        gated_sum_forward<T>(br.gate, 0, br.g.positions(), x.a, x.s, out + b * br.g.q * br.g.positions());
    }
}

// Its gradients, from grad (B, Q, X' * Y') and, where `saved` (then a is an output too),
// grad_a (B, X', Y', H, Q) or null. Writes grad_planes and grad_channel as
// AttendedMaxBackward does; adds into the thread's grad_kernels and grad_w1, grad_w2 (each
// k_s * k_s * H * Q).
template <typename T>
void branch_backward(const int64_t* geometry, int64_t b0, int64_t b1, const T* planes, const T* kernels,
                     const T* channel, const T* w1, const T* w2, const T* grad, const T* grad_a, T* s, T* m,
                     uint8_t* win, T* a, T* grad_planes, T* grad_channel, T* grad_kernels, T* grad_w1, T* grad_w2) {
    const Branch br(geometry);
    const Geometry& g = br.g;
    const int64_t n = br.values(), channels = br.spatial[2], taps = br.spatial[3] * br.spatial[3];
    // The input gradient of a size-keeping convolution: the same convolution with the filter turned
    // by 180 degrees.
    std::vector<T> flipped(w1 ? 2 * taps * channels : 0);
    for (int64_t t = 0; t < (w1 ? taps : 0); ++t)
        for (int64_t j = 0; j < channels; ++j) {
            flipped[t * channels + j] = w1[(taps - 1 - t) * channels + j];
            flipped[(taps + t) * channels + j] = w2[(taps - 1 - t) * channels + j];
        }
    std::vector<T> folded(g.c * g.taps() * g.q), own, work(4 * n);
    std::vector<uint8_t> own_win;
    T *grad_z = work.data(), *grad_s = grad_z + n, *grad_m = grad_s + n, *grad_s_conv = grad_m + n;
    AttendedMaxBackward<T> max_backward(g);
    for (int64_t b = b0; b < b1; ++b) {
        if (!w1) {  // no spatial attention: every S term gets the incoming gradient, the max none
            own_win.resize(n);  // (zeros: any winner will do)
            const T* e = grad + b * g.q * g.positions();
            for (int64_t p = 0; p < g.positions(); ++p)
                for (int64_t h = 0; h < g.h; ++h)
                    for (int64_t j = 0; j < g.q; ++j) grad_s[(p * g.h + h) * g.q + j] = e[j * g.positions() + p];
            std::fill(grad_m, grad_m + n, T(0));
            for (int64_t h = 0; h < g.h; ++h)
                max_backward.item(b, h, planes, kernels, channel, grad_s, grad_m, own_win.data(), grad_planes,
                                  grad_channel, grad_kernels);
            continue;
        }
        const SampleBuffers<T> x = sample_buffers(n, b, s, m, win, a, own, own_win);
        if (!s) branch_statistics(br, b, planes, kernels, channel, w1, w2, x.s, x.m, x.win, x.a, folded.data());
        gated_sum_backward<T>(br.gate, 0, g.positions(), x.a, x.s, grad + b * g.q * g.positions(), grad_z, grad_s);
        if (grad_a) {  // the gradient reaching the returned a: through its sigmoid into z
            const T* ga = grad_a + b * n;
#pragma omp simd
            for (int64_t i = 0; i < n; ++i) grad_z[i] += ga[i] * x.a[i] * (T(1) - x.a[i]);
        }
        depthwise_pair_k<false, T>(br.spatial, 0, g.out_x, grad_z, nullptr, flipped.data(),
                                   flipped.data() + taps * channels, grad_s_conv, grad_m);
#pragma omp simd
        for (int64_t i = 0; i < n; ++i) grad_s[i] += grad_s_conv[i];
        depthwise_weight_grad<T>(br.spatial, 0, g.out_x, x.s, grad_z, grad_w1);
        depthwise_weight_grad<T>(br.spatial, 0, g.out_x, x.m, grad_z, grad_w2);
        for (int64_t h = 0; h < g.h; ++h)
            max_backward.item(b, h, planes, kernels, channel, grad_s, grad_m, x.win, grad_planes, grad_channel,
                              grad_kernels);
    }
}

// Runs body(b0, b1, thread) on `workers` OpenMP threads, each over its share of [0, batch).
// Loaded into a process with PyTorch, this library shares PyTorch's OpenMP runtime (the same
// libgomp.so.1) and so its threads. Threads of a pool of our own would compete for the cores
// with PyTorch's, which keep spinning for a while after each operation: every kernel here ran
// about 1.5x slower that way inside a training step.
template <typename Body>
void split(int64_t workers, int64_t batch, Body&& body) {
#pragma omp parallel num_threads(static_cast<int>(workers))
    {
        const int64_t thread = omp_get_thread_num(), threads = omp_get_num_threads();
        body(batch * thread / threads, batch * (thread + 1) / threads, thread);
    }
}

}  // namespace

// C entry points for ctypes, one per kernel and dtype (f32, f64). Each takes the geometry,
// the number of threads and the length of the range they share (samples, or rows for the
// depthwise kernels), then the kernel's arguments; a kernel that sums over the range into a
// per-thread output takes its base pointer and the stride between threads' copies instead.
#define AAGC_SPLIT(call) split(workers, batch, [&](int64_t b0, int64_t b1, int64_t thread) { call; })
#define AAGC_EXPORT(T, suffix)                                                                                  \
    extern "C" void spatial_max_##suffix(const int64_t* g, int64_t workers, int64_t batch, const T* p,         \
                                         const T* k, T* value, int32_t* where) {                              \
        AAGC_SPLIT(spatial_max<T>(g, b0, b1, p, k, value, where));                                            \
    }                                                                                                         \
    extern "C" void spatial_max_backward_##suffix(const int64_t* g, int64_t workers, int64_t batch,            \
                                                  const T* p, const T* k, const int32_t* where, const T* grad, \
                                                  T* dp, T* dk, int64_t stride) {                             \
        AAGC_SPLIT(spatial_max_backward<T>(g, b0, b1, p, k, where, grad, dp, dk + thread * stride));          \
    }                                                                                                         \
    extern "C" void branch_forward_##suffix(const int64_t* g, int64_t workers, int64_t batch, const T* p,       \
                                            const T* k, const T* alpha, const T* w1, const T* w2, T* out, T* s,   \
                                            T* m, uint8_t* win, T* a) {                                       \
        AAGC_SPLIT(branch_forward<T>(g, b0, b1, p, k, alpha, w1, w2, out, s, m, win, a));                     \
    }                                                                                                         \
    extern "C" void branch_backward_##suffix(const int64_t* g, int64_t workers, int64_t batch, const T* p,      \
                                             const T* k, const T* alpha, const T* w1, const T* w2,             \
                                             const T* grad, const T* grad_a, T* s, T* m, uint8_t* win, T* a,   \
                                             T* dp, T* dalpha, T* sums, int64_t stride) {                      \
        const Branch br(g);                                                                                   \
        const int64_t dk = br.g.c * br.g.h * br.g.taps() * br.g.q, dw = br.spatial[3] * br.spatial[3] * br.spatial[2]; \
        AAGC_SPLIT(T* mine = sums + thread * stride;                                                          \
                   branch_backward<T>(g, b0, b1, p, k, alpha, w1, w2, grad, grad_a, s, m, win, a, dp, dalpha,  \
                                      mine, mine + dk, mine + dk + dw));                                      \
    }                                                                                                         \
    extern "C" void depthwise_pair_forward_##suffix(const int64_t* g, int64_t workers, int64_t batch,          \
                                                    const T* in1, const T* in2, const T* w1, const T* w2,      \
                                                    T* out) {                                                 \
        AAGC_SPLIT((depthwise_pair_k<true, T>(g, b0, b1, in1, in2, w1, w2, out, nullptr)));                   \
    }                                                                                                         \
    extern "C" void depthwise_pair_input_grad_##suffix(const int64_t* g, int64_t workers, int64_t batch,       \
                                                       const T* grad, const T* w1, const T* w2, T* out1,       \
                                                       T* out2) {                                             \
        AAGC_SPLIT((depthwise_pair_k<false, T>(g, b0, b1, grad, nullptr, w1, w2, out1, out2)));               \
    }                                                                                                         \
    extern "C" void depthwise_weight_grad_##suffix(const int64_t* g, int64_t workers, int64_t batch,           \
                                                   const T* input, const T* grad, T* out, int64_t stride) {    \
        AAGC_SPLIT(depthwise_weight_grad<T>(g, b0, b1, input, grad, out + thread * stride));                  \
    }

AAGC_EXPORT(float, f32)
AAGC_EXPORT(double, f64)

// Filters per vector in this build: the callers pad the filter axis to at least this many.
extern "C" int64_t lanes() { return LANES; }
