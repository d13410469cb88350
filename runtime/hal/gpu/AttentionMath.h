// The math of the attention GPU kernels (causal grouped-query attention
// with rotary embeddings), compiled for the device by nvcc and for the host
// by g++ (Simt.h). It follows the CPU kernel (runtime/kernels/
// AttentionKernels.cpp) in flash-attention form: one warp per query row (or,
// for dK and dV, per key row) walks over the keys (queries) kCount at a time
// with an online softmax, lane j holding the head's elements j, j + kCount,
// ... in registers and scoring key (query) base + j of each block, so no
// [seq, seq] probability matrix is ever stored.
#ifndef PIPER_RUNTIME_HAL_GPU_ATTENTIONMATH_H
#define PIPER_RUNTIME_HAL_GPU_ATTENTIONMATH_H

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "runtime/hal/gpu/ElementwiseMath.h"
#include "runtime/hal/gpu/Simt.h"
#include "runtime/kernels/Rope.h"

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
  RopeScaling rope;     // Llama 3.1's frequencies (factor 0: none)
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
PIPER_HOST_DEVICE inline void ropeAngle(double theta,
                                        const RopeScaling &scaling,
                                        int64_t headDim, int64_t t, int64_t i,
                                        double &c, double &sn) {
  double freq = ropeFrequency(theta, headDim, i, scaling);
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

// The lane's share of a row, read W floats at a time (W = 1, or 4 when
// every row the call reads starts 16-byte aligned and hd is a multiple of
// 4: attentionWidth): slot t < kPer (kPer = kMaxHeadDim / kCount, a
// compile-time bound, so that the shares live in registers) holds element
// (t / W) (kCount W) + lane W + t % W, as far as the row goes (W = 1:
// elements lane, lane + kCount, ...). These loops hold no reduction, so the
// lanes may leave them at different t.

/// The element in slot t of the lane's share.
template <int W, class Lanes>
PIPER_HOST_DEVICE inline int64_t laneElement(Lanes lanes, int t) {
  return int64_t(t / W) * (Lanes::kCount * W) + lanes.lane() * W + t % W;
}

/// out[0..W) = x[0..W) (x 16-byte aligned when W = 4).
template <int W>
PIPER_HOST_DEVICE inline void loadVector(const float *x, float *out) {
#ifdef __CUDA_ARCH__
  if constexpr (W == 4) {
    float4 v = *reinterpret_cast<const float4 *>(x);
    out[0] = v.x;
    out[1] = v.y;
    out[2] = v.z;
    out[3] = v.w;
  } else {
    for (int w = 0; w < W; ++w)
      out[w] = x[w];
  }
#else
  for (int w = 0; w < W; ++w)
    out[w] = x[w];
#endif
}

/// Loads the lane's share of row x (count elements) into r.
template <int W, class Lanes>
PIPER_HOST_DEVICE inline void loadLaneShare(Lanes lanes, const float *x,
                                            int64_t count, float *r) {
  constexpr int kPer = kMaxHeadDim / Lanes::kCount;
  PIPER_ATTENTION_UNROLL
  for (int t = 0; t < kPer; t += W) {
    int64_t e = laneElement<W>(lanes, t);
    if (e >= count)
      break;
    loadVector<W>(x + e, r + t);
  }
}

/// Zeroes the lane's share of r.
template <int W, class Lanes>
PIPER_HOST_DEVICE inline void zeroLaneShare(Lanes lanes, float *r,
                                            int64_t count) {
  constexpr int kPer = kMaxHeadDim / Lanes::kCount;
  PIPER_ATTENTION_UNROLL
  for (int t = 0; t < kPer; ++t) {
    if (laneElement<W>(lanes, t) >= count)
      break;
    r[t] = 0;
  }
}

/// acc += w * x over the lane's share.
template <int W, class Lanes>
PIPER_HOST_DEVICE inline void laneAxpy(Lanes lanes, float *acc, float w,
                                       const float *x, int64_t count) {
  constexpr int kPer = kMaxHeadDim / Lanes::kCount;
  PIPER_ATTENTION_UNROLL
  for (int t = 0; t < kPer; t += W) {
    int64_t e = laneElement<W>(lanes, t);
    if (e >= count)
      break;
    float v[W];
    loadVector<W>(x + e, v);
    PIPER_ATTENTION_UNROLL
    for (int u = 0; u < W; ++u)
      acc[t + u] += w * v[u];
  }
}

/// acc *= c over the lane's share.
template <int W, class Lanes>
PIPER_HOST_DEVICE inline void laneScale(Lanes lanes, float *acc, float c,
                                        int64_t count) {
  constexpr int kPer = kMaxHeadDim / Lanes::kCount;
  PIPER_ATTENTION_UNROLL
  for (int t = 0; t < kPer; ++t) {
    if (laneElement<W>(lanes, t) >= count)
      break;
    acc[t] *= c;
  }
}

/// Stores the lane's share of r, times `scale`, to row x.
template <int W, class Lanes>
PIPER_HOST_DEVICE inline void storeLaneShare(Lanes lanes, const float *r,
                                             float scale, float *x,
                                             int64_t count) {
  constexpr int kPer = kMaxHeadDim / Lanes::kCount;
  PIPER_ATTENTION_UNROLL
  for (int t = 0; t < kPer; ++t) {
    int64_t e = laneElement<W>(lanes, t);
    if (e >= count)
      break;
    x[e] = r[t] * scale;
  }
}

/// The dots of a block of kCount rows against one row held in shares:
/// lane j gets <r, x_j> for j < count (x_j = x + j * ldx; rows from count on
/// are not read, their lanes get 0). Every lane multiplies its share of r
/// with its share of every row (coalesced reads), then the lanes' partial
/// sums are reduced and scattered at once (a transpose by halves: at offset
/// o each lane keeps the half of its partials whose key has its bit o, sends
/// the other half to lane ^ o and adds what it receives), kCount - 1
/// shuffles in all. Each dot adds the same lanes' partials in the same tree
/// (addition commutes), so <r, x_j> has the same bits whichever lane it
/// lands in and whichever of the two rows is r: the passes of the backward
/// recompute exactly the forward's scores. count is the same in every lane.
template <int W, class Lanes>
PIPER_HOST_DEVICE inline float blockDot(Lanes lanes, const float *r,
                                        const float *x, int64_t ldx,
                                        int64_t count, int64_t hd) {
  constexpr int kLanes = Lanes::kCount;
  constexpr int kPer = kMaxHeadDim / kLanes;
  const int lane = lanes.lane();
  float part[kLanes];
  PIPER_ATTENTION_UNROLL
  for (int j = 0; j < kLanes; ++j) {
    float sum = 0;
    if (j < count) {
      const float *row = x + j * ldx;
      PIPER_ATTENTION_UNROLL
      for (int t = 0; t < kPer; t += W) {
        int64_t e = laneElement<W>(lanes, t);
        if (e >= hd)
          break;
        float v[W];
        loadVector<W>(row + e, v);
        PIPER_ATTENTION_UNROLL
        for (int u = 0; u < W; ++u)
          sum += r[t + u] * v[u];
      }
    }
    part[j] = sum;
  }
  // (The inner loop's bound is a constant so that both loops unroll and
  // part stays in registers.)
  PIPER_ATTENTION_UNROLL
  for (int o = kLanes / 2; o > 0; o >>= 1) {
    const bool upper = (lane & o) != 0;
    PIPER_ATTENTION_UNROLL
    for (int j = 0; j < kLanes / 2; ++j) {
      if (j < o) {
        float send = upper ? part[j] : part[j + o];
        float keep = upper ? part[j + o] : part[j];
        part[j] = keep + lanes.shuffleXor(send, o);
      }
    }
  }
  return part[0];
}

/// The width the shares of a call are read with: 4 when hd is a multiple
/// of 4 and every base pointer (q and k's source, qkv, dy when given) is
/// 16-byte aligned (the leading dimensions are multiples of hd), else 1.
/// Checks addresses only, never data.
inline int attentionWidth(const AttentionShape &s, const void *qk,
                          const void *qkv, const void *dy) {
  auto aligned = [](const void *p) {
    return reinterpret_cast<uintptr_t>(p) % 16 == 0;
  };
  return s.headDim % 4 == 0 && aligned(qk) && aligned(qkv) &&
                 (dy == nullptr || aligned(dy))
             ? 4
             : 1;
}

/// body(std::integral_constant<int, W>()) for W = width (4 or 1): a row
/// body written once for both widths.
template <class F> PIPER_HOST_DEVICE inline void withWidth(int width, F body) {
  if (width == 4)
    body(std::integral_constant<int, 4>());
  else
    body(std::integral_constant<int, 1>());
}

/// The number of rows of the block starting at `first` that are at most
/// `last` (at most kCount), the same in every lane.
template <class Lanes>
PIPER_HOST_DEVICE inline int64_t blockCount(int64_t first, int64_t last) {
  int64_t n = last - first + 1;
  return n < Lanes::kCount ? n : Lanes::kCount;
}

PIPER_HOST_DEVICE inline float maxF(float a, float b) { return a > b ? a : b; }

/// Ring attention's log-sum-exp of row `row`, head h, in an lse [N, 2
/// heads]: a bf16 value in column h and the exact rest in column heads + h
/// (0 for an infinite value), as runtime/kernels/AttentionChecks.h's
/// storeRingLse and loadRingLse.
PIPER_HOST_DEVICE inline void storeRingLse(float *lse, int64_t heads,
                                           int64_t row, int64_t h, float v) {
  float *p = lse + row * 2 * heads;
  if (!(v > -INFINITY && v < INFINITY)) {
    p[h] = v;
    p[heads + h] = 0.0f;
    return;
  }
  float hi = fromBf16(toBf16(v));
  p[h] = hi;
  p[heads + h] = v - hi;
}
PIPER_HOST_DEVICE inline float loadRingLse(const float *lse, int64_t heads,
                                           int64_t row, int64_t h) {
  const float *p = lse + row * 2 * heads;
  return p[h] + p[heads + h];
}

/// The forward of query row i of one (sequence, head) with an online
/// softmax over keys 0..last (last = i for causal attention), kCount keys
/// at a time: lane j scores key base + j (blockDot; keys past last score
/// -inf), one max and one sum per block update the running maximum m and
/// l = sum_j exp(s_j - m), the accumulator is rescaled once, then every
/// key's p_j (a shuffle from its lane) adds p_j v_j to the lane's share of
/// acc, keys in order. On return acc holds sum_j exp(s_j - m) v_j,
/// s_j = scale <q_i, k_j>; the output row is acc / l (last < 0: no key,
/// acc 0, m -inf, l 0). Every lane runs every iteration: the loop bounds
/// depend on last only.
template <int W, class Lanes>
PIPER_HOST_DEVICE inline void
attendRow(Lanes lanes, const AttentionShape &s, const AttentionHead &h,
          int64_t i, int64_t last, float *acc, float &m, float &l) {
  constexpr int kPer = kMaxHeadDim / Lanes::kCount;
  const int64_t hd = s.headDim;
  float q[kPer];
  loadLaneShare<W>(lanes, h.q + i * h.ldq, hd, q);
  zeroLaneShare<W>(lanes, acc, hd);
  m = -INFINITY;
  l = 0;
  for (int64_t base = 0; base <= last; base += Lanes::kCount) {
    const int64_t count = blockCount<Lanes>(base, last);
    float dot = blockDot<W>(lanes, q, h.k + base * h.ldk, h.ldk, count, hd);
    const bool valid = lanes.lane() < count;
    float score = valid ? s.scale * dot : -INFINITY;
    // The first block's lane 0 holds key 0: the maximum is finite, and the
    // rescale of the empty sums is exp(-inf) = 0.
    float mNew = maxF(m, lanes.max(score));
    float c = expF(m - mNew);
    float p = valid ? expF(score - mNew) : 0.0f;
    l = l * c + lanes.sum(p);
    m = mNew;
    laneScale<W>(lanes, acc, c, hd);
    for (int64_t j = 0; j < count; ++j)
      laneAxpy<W>(lanes, acc, lanes.shuffle(p, int(j)),
                  h.v + (base + j) * h.ldv, hd);
  }
}

/// Ring attention under context parallelism (docs/context-parallel.md):
/// one step attends a member's query rows to member `owner`'s key/value
/// shard. The base shape's `seq` is the rows each member holds of a
/// sequence (globalSeq / cp) and `batch` the sequences; rows are at global
/// positions ringPosition.
struct RingShape : AttentionShape {
  int64_t globalSeq = 0, cp = 1, member = 0, owner = 0;
};

/// The global position of local row t of member `member`'s part of a
/// sequence of `seq` tokens over `cp` members: chunks m and 2cp-1-m of 2cp
/// (plan::contextPosition).
PIPER_HOST_DEVICE inline int64_t ringPosition(int64_t seq, int64_t cp,
                                              int64_t member, int64_t t) {
  if (cp <= 1)
    return t;
  int64_t chunk = seq / (2 * cp);
  return t < chunk ? member * chunk + t
                   : (2 * cp - 1 - member) * chunk + (t - chunk);
}

/// How many of member `member`'s local rows 0..local-1 lie before `pos`
/// (at most `pos` when `inclusive`): positions increase with the row, so
/// those rows are a prefix, found by bisection.
PIPER_HOST_DEVICE inline int64_t ringRowsBefore(const RingShape &s,
                                                int64_t member, int64_t pos,
                                                bool inclusive) {
  int64_t lo = 0, hi = s.seq;
  while (lo < hi) {
    int64_t mid = (lo + hi) / 2;
    int64_t p = ringPosition(s.globalSeq, s.cp, member, mid);
    if (p < pos || (inclusive && p == pos))
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

/// Device scratch of one ring step: q | k rotated at their positions
/// ([rows, qCols + kvCols] floats) with rotary embeddings, and for the
/// backward D = <dy, y> per (sequence, head, query).
inline AttentionScratch ringScratch(const RingShape &s, bool grad) {
  AttentionScratch l;
  size_t at = 0;
  if (s.rotary()) {
    l.qkOffset = at;
    at += attentionAlign(static_cast<size_t>(s.rows() * (s.qCols + s.kvCols)) *
                         sizeof(float));
  }
  if (grad) {
    l.statsOffset = at;
    at += attentionAlign(static_cast<size_t>(s.batch * s.heads * s.seq) *
                         sizeof(float));
  }
  l.bytes = at;
  return l;
}

} // namespace piper::runtime::hal::PIPER_GPU_NS

#endif // PIPER_RUNTIME_HAL_GPU_ATTENTIONMATH_H
