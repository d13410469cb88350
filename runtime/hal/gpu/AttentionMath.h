// The math of the attention GPU kernels (causal grouped-query attention
// with rotary embeddings), compiled for the device by nvcc and for the host
// by g++ (Simt.h). It follows the CPU kernel (runtime/kernels/
// AttentionKernels.cpp) in flash-attention form: one warp per query row (or,
// for dK and dV, per key row) walks over the keys (queries) with an online
// softmax, lane j holding the head's elements j, j + kCount, ... in
// registers, so no [seq, seq] probability matrix is ever stored.
#ifndef PIPER_RUNTIME_HAL_GPU_ATTENTIONMATH_H
#define PIPER_RUNTIME_HAL_GPU_ATTENTIONMATH_H

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "runtime/hal/gpu/Simt.h"

#ifdef __CUDACC__
#define PIPER_ATTENTION_UNROLL _Pragma("unroll")
#else
#define PIPER_ATTENTION_UNROLL
#endif

namespace piper::runtime::hal::PIPER_GPU_NS {

/// The largest head dimension the GPU kernels take: a warp's lanes hold a
/// head's q, accumulators and gradients in registers, kMaxHeadDim / 32
/// floats each.
constexpr int kMaxHeadDim = 256;

/// The sizes of one attention call (detail::AttentionDims, without the
/// host-only parts). qkv is [batch * seq, cols], cols = qCols + 2 kvCols,
/// [q | k | v].
struct AttentionShape {
  int64_t batch = 0, seq = 0, heads = 0, kvHeads = 0, headDim = 0;
  int64_t qCols = 0, kvCols = 0, cols = 0;
  double ropeTheta = 0; // 0: no rotary embedding
  float scale = 0;      // 1 / sqrt(headDim), as the CPU rounds it

  PIPER_HOST_DEVICE int64_t group() const { return heads / kvHeads; }
  PIPER_HOST_DEVICE int64_t rows() const { return batch * seq; }
  PIPER_HOST_DEVICE int64_t half() const { return headDim / 2; }
  PIPER_HOST_DEVICE bool rotary() const { return ropeTheta != 0; }
};

/// Device scratch of one call, carved from one workspace block: the rotary
/// table (cos, sin: [seq, hd/2] doubles), the rotated q | k
/// ([rows, qCols + kvCols] floats) and, for the backward, three floats per
/// (batch, head, query): the row's score maximum, 1 / its softmax
/// denominator and D = <dy, y>.
struct AttentionScratch {
  size_t cosOffset = 0, sinOffset = 0, qkOffset = 0, statsOffset = 0;
  size_t bytes = 0;
};

inline size_t attentionAlign(size_t bytes) { return (bytes + 255) / 256 * 256; }

inline AttentionScratch attentionScratch(const AttentionShape &s, bool grad) {
  AttentionScratch l;
  size_t at = 0;
  if (s.rotary()) {
    size_t table = static_cast<size_t>(s.seq * s.half()) * sizeof(double);
    l.cosOffset = at;
    at += attentionAlign(table);
    l.sinOffset = at;
    at += attentionAlign(table);
    l.qkOffset = at;
    at += attentionAlign(static_cast<size_t>(s.rows() * (s.qCols + s.kvCols)) *
                         sizeof(float));
  }
  if (grad) {
    l.statsOffset = at;
    at += attentionAlign(static_cast<size_t>(3 * s.batch * s.heads * s.seq) *
                         sizeof(float));
  }
  l.bytes = at;
  return l;
}

/// The rotary table's entry (t, i): cos and sin of t * theta^(-2i/hd), in
/// double, as the CPU's RopeTable.
PIPER_HOST_DEVICE inline void ropeAngle(double theta, int64_t headDim,
                                        int64_t t, int64_t i, double &c,
                                        double &sn) {
  double freq = pow(theta, -2.0 * double(i) / double(headDim));
  double angle = double(t) * freq;
  c = cos(angle);
  sn = sin(angle);
}

/// Rotates the pair (x1, x2) = (x_i, x_{i + hd/2}) by the angle of (c, sn),
/// or by its inverse (the transpose, for gradients), in double.
PIPER_HOST_DEVICE inline void ropePair(float x1, float x2, double c, double sn,
                                       bool inverse, float &o1, float &o2) {
  double s = inverse ? -sn : sn;
  o1 = static_cast<float>(double(x1) * c - double(x2) * s);
  o2 = static_cast<float>(double(x2) * c + double(x1) * s);
}

/// The rows a warp-per-row body walks over, for one (sequence, head):
/// q rows (query heads), k and v rows (their kv head), dy rows, each with
/// its leading dimension; row t of x is x + t * ldx.
struct AttentionHead {
  const float *q, *k, *v, *dy;
  int64_t ldq, ldk, ldv, lddy;
};

// The lane's share of a row: elements lane + t kCount for t < kPer (kPer =
// kMaxHeadDim / kCount, a compile-time bound, so that the shares live in
// registers), as far as the row goes. These loops hold no reduction, so the
// lanes may leave them at different t.

/// Loads the lane's share of row x (count elements) into r.
template <class Lanes>
PIPER_HOST_DEVICE inline void loadLaneShare(Lanes lanes, const float *x,
                                            int64_t count, float *r) {
  constexpr int kPer = kMaxHeadDim / Lanes::kCount;
  PIPER_ATTENTION_UNROLL
  for (int t = 0; t < kPer; ++t) {
    int64_t e = lanes.lane() + int64_t(t) * Lanes::kCount;
    if (e >= count)
      break;
    r[t] = x[e];
  }
}

/// Zeroes the lane's share of r.
template <class Lanes>
PIPER_HOST_DEVICE inline void zeroLaneShare(Lanes lanes, float *r,
                                            int64_t count) {
  constexpr int kPer = kMaxHeadDim / Lanes::kCount;
  PIPER_ATTENTION_UNROLL
  for (int t = 0; t < kPer; ++t) {
    int64_t e = lanes.lane() + int64_t(t) * Lanes::kCount;
    if (e >= count)
      break;
    r[t] = 0;
  }
}

/// <r, x> over the row (every lane gets it): the lane's share of r against
/// row x, then the lanes' sum.
template <class Lanes>
PIPER_HOST_DEVICE inline float laneDot(Lanes lanes, const float *r,
                                       const float *x, int64_t count) {
  constexpr int kPer = kMaxHeadDim / Lanes::kCount;
  float partial = 0;
  PIPER_ATTENTION_UNROLL
  for (int t = 0; t < kPer; ++t) {
    int64_t e = lanes.lane() + int64_t(t) * Lanes::kCount;
    if (e >= count)
      break;
    partial += r[t] * x[e];
  }
  return lanes.sum(partial);
}

/// acc += w * x over the lane's share.
template <class Lanes>
PIPER_HOST_DEVICE inline void laneAxpy(Lanes lanes, float *acc, float w,
                                       const float *x, int64_t count) {
  constexpr int kPer = kMaxHeadDim / Lanes::kCount;
  PIPER_ATTENTION_UNROLL
  for (int t = 0; t < kPer; ++t) {
    int64_t e = lanes.lane() + int64_t(t) * Lanes::kCount;
    if (e >= count)
      break;
    acc[t] += w * x[e];
  }
}

/// acc *= c over the lane's share.
template <class Lanes>
PIPER_HOST_DEVICE inline void laneScale(Lanes lanes, float *acc, float c,
                                        int64_t count) {
  constexpr int kPer = kMaxHeadDim / Lanes::kCount;
  PIPER_ATTENTION_UNROLL
  for (int t = 0; t < kPer; ++t) {
    int64_t e = lanes.lane() + int64_t(t) * Lanes::kCount;
    if (e >= count)
      break;
    acc[t] *= c;
  }
}

/// Stores the lane's share of r, times `scale`, to row x.
template <class Lanes>
PIPER_HOST_DEVICE inline void storeLaneShare(Lanes lanes, const float *r,
                                             float scale, float *x,
                                             int64_t count) {
  constexpr int kPer = kMaxHeadDim / Lanes::kCount;
  PIPER_ATTENTION_UNROLL
  for (int t = 0; t < kPer; ++t) {
    int64_t e = lanes.lane() + int64_t(t) * Lanes::kCount;
    if (e >= count)
      break;
    x[e] = r[t] * scale;
  }
}

/// The forward of query row i of one (sequence, head) with an online
/// softmax over keys 0..i: on return acc (lane's share) holds
/// sum_j exp(s_j - m) v_j, m the largest score s_j = scale <q_i, k_j> and
/// l = sum_j exp(s_j - m); the output row is acc / l. Every lane runs every
/// iteration (the reductions need all of them): the scores, and so the
/// branches on them, are the same in every lane (the butterfly sums agree
/// bit for bit).
template <class Lanes>
PIPER_HOST_DEVICE inline void attendRow(Lanes lanes, const AttentionShape &s,
                                        const AttentionHead &h, int64_t i,
                                        float *acc, float &m, float &l) {
  constexpr int kPer = kMaxHeadDim / Lanes::kCount;
  const int64_t hd = s.headDim;
  float q[kPer];
  loadLaneShare(lanes, h.q + i * h.ldq, hd, q);
  zeroLaneShare(lanes, acc, hd);
  m = -INFINITY;
  l = 0;
  for (int64_t j = 0; j <= i; ++j) {
    float score = s.scale * laneDot(lanes, q, h.k + j * h.ldk, hd);
    if (score > m) {
      // Rescale what was summed against the old maximum (exp(-inf) = 0 on
      // the first key).
      float c = expF(m - score);
      l *= c;
      laneScale(lanes, acc, c, hd);
      m = score;
    }
    float p = expF(score - m);
    l += p;
    laneAxpy(lanes, acc, p, h.v + j * h.ldv, hd);
  }
}

} // namespace piper::runtime::hal::PIPER_GPU_NS

#endif // PIPER_RUNTIME_HAL_GPU_ATTENTIONMATH_H
