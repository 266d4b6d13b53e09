// Inference batch norm and ReLU of a concatenation, in one pass (relu_bn.py):
//
//   out[b, c, g, x, y] = max(0, part(c)[b, c', g, x, y] * scale[c] + shift[c])
//
// where channel c of the concatenation is channel c' of one of the parts. PyTorch makes three passes over
// memory for it (the concatenation, the batch norm, the ReLU), each reading and writing tensors that, for the
// PCam DenseNets' first transition, are larger than the L3 cache; this loop reads each part once and writes
// the result once.
//
// Layouts: out contiguous (B, C, G, X, Y), C the sum of the parts' channels, in order; each part a strided
// (B, C_part, G, X, Y) view whose last axis is contiguous (a cropped view of a larger tensor is fine).
// geometry: {B, C, G, X, Y}; strides: per part {C_part, stride_b, stride_c, stride_g, stride_x}.
// The threads share the rows (b, c, g, x) of the output.

#include <cstdint>
#include <omp.h>

namespace {

template <typename T>
void relu_bn(const int64_t* geometry, int64_t workers, const int64_t* strides, const T* const* parts,
             const T* scale, const T* shift, T* out) {
    const int64_t b_n = geometry[0], c_n = geometry[1], g_n = geometry[2], x_n = geometry[3], y_n = geometry[4];
    const int64_t rows = b_n * c_n * g_n * x_n;
#pragma omp parallel num_threads(static_cast<int>(workers))
    {
        const int64_t thread = omp_get_thread_num(), threads = omp_get_num_threads();
        for (int64_t row = rows * thread / threads, end = rows * (thread + 1) / threads; row < end; ++row) {
            int64_t rest = row;
            const int64_t x = rest % x_n;
            rest /= x_n;
            const int64_t g = rest % g_n;
            rest /= g_n;
            const int64_t c = rest % c_n;
            const int64_t b = rest / c_n;
            int64_t part = 0, first = 0;  // the part holding channel c, and its first channel
            while (c >= first + strides[5 * part]) first += strides[5 * part++];
            const int64_t* s = strides + 5 * part;
            const T* in = parts[part] + b * s[1] + (c - first) * s[2] + g * s[3] + x * s[4];
            T* o = out + row * y_n;
            const T a = scale[c], z = shift[c];
#pragma omp simd
            for (int64_t y = 0; y < y_n; ++y) {
                const T v = in[y] * a + z;
                o[y] = v < T(0) ? T(0) : v;  // NaN stays NaN, as torch.relu
            }
        }
    }
}

}  // namespace

extern "C" {
void relu_bn_f32(const int64_t* geometry, int64_t workers, const int64_t* strides, const float* const* parts,
                 const float* scale, const float* shift, float* out) {
    relu_bn(geometry, workers, strides, parts, scale, shift, out);
}
void relu_bn_f64(const int64_t* geometry, int64_t workers, const int64_t* strides, const double* const* parts,
                 const double* scale, const double* shift, double* out) {
    relu_bn(geometry, workers, strides, parts, scale, shift, out);
}
}
