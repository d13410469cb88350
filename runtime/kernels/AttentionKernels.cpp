// Causal multi-head self-attention over a packed [q | k | v] projection, with
// optional grouped-query heads and rotary position embeddings, forward and
// backward (the backward recomputes the probabilities).
#include <algorithm>
#include <cmath>
#include <limits>

#include "runtime/kernels/AttentionChecks.h"
#include "runtime/kernels/KernelUtil.h"
#include "runtime/kernels/VecMath.h"

namespace piper::runtime::detail {

namespace {

// Reads the attributes and derives the sizes from qkv and `out` ([N, heads*hd]:
// y of the forward, dy of the backward).
Status attentionDims(const KernelArgs &a, const TensorRef &qkv,
                     const TensorRef &out, const char *outName,
                     AttentionDims &d) {
  PIPER_RETURN_IF_ERROR(expectMatrix(a, qkv, "qkv", plan::F32, d.rows, d.cols));
  PIPER_RETURN_IF_ERROR(
      readPositiveInt(a, KernelAttr::kHeads, std::nullopt, d.heads));
  PIPER_RETURN_IF_ERROR(
      readPositiveInt(a, KernelAttr::kKvHeads, d.heads, d.kvHeads));
  PIPER_RETURN_IF_ERROR(
      readPositiveInt(a, KernelAttr::kSeq, std::nullopt, d.seq));
  PIPER_RETURN_IF_ERROR(readFloat(a, KernelAttr::kRopeTheta, 0.0, d.ropeTheta));
  if (d.heads % d.kvHeads != 0)
    return a.error("attribute 'heads' " + std::to_string(d.heads) +
                   " is not a multiple of 'kv_heads' " +
                   std::to_string(d.kvHeads));
  if (d.ropeTheta < 0)
    return a.error("attribute 'rope_theta' must not be negative");

  int64_t outRows = 0;
  PIPER_RETURN_IF_ERROR(
      expectMatrix(a, out, outName, plan::F32, outRows, d.qCols));
  if (outRows != d.rows)
    return a.error(std::string(outName) + " has shape " +
                   shapeString(out.shape) + ", expected [" +
                   std::to_string(d.rows) + ",*]");
  if (d.qCols == 0 || d.qCols % d.heads != 0)
    return a.error(std::string(outName) + " has " + std::to_string(d.qCols) +
                   " columns, expected a positive multiple of heads " +
                   std::to_string(d.heads));
  d.headDim = d.qCols / d.heads;
  if (d.ropeTheta != 0 && d.headDim % 2 != 0)
    return a.error("head dim " + std::to_string(d.headDim) +
                   " must be even for rotary embeddings");
  // kvHeads <= heads, so kvCols <= qCols; only the sum can overflow.
  d.kvCols = d.kvHeads * d.headDim;
  if ((__int128)d.qCols + 2 * (__int128)d.kvCols != d.cols)
    return a.error("qkv has " + std::to_string(d.cols) +
                   " columns, expected (heads " + std::to_string(d.heads) +
                   " + 2 * kv_heads " + std::to_string(d.kvHeads) +
                   ") * head dim " + std::to_string(d.headDim));
  if (d.rows % d.seq != 0)
    return a.error("qkv has " + std::to_string(d.rows) +
                   " rows, not a multiple of seq " + std::to_string(d.seq));
  d.batch = d.rows / d.seq;
  return expectBlasDims(a, {d.seq, d.cols});
}

// cos and sin of pos * theta^(-2i/hd) for pos < seq and i < hd/2, row-major
// [seq, hd/2], in double.
struct RopeTable {
  int64_t half = 0;
  std::vector<double> cos, sin;

  explicit RopeTable(const AttentionDims &d) : half(d.headDim / 2) {
    if (d.ropeTheta == 0 || d.batch == 0)
      return;
    cos.resize(d.seq * half);
    sin.resize(d.seq * half);
    for (int64_t i = 0; i < half; ++i) {
      double freq = std::pow(d.ropeTheta, -2.0 * double(i) / d.headDim);
      for (int64_t t = 0; t < d.seq; ++t) {
        double angle = double(t) * freq;
        cos[t * half + i] = std::cos(angle);
        sin[t * half + i] = std::sin(angle);
      }
    }
  }

  // Rotates the heads of `count` columns of `rows` rows at positions 0..rows-1:
  // (x_i, x_{i+hd/2}) -> (x_i c - x_{i+hd/2} s, x_{i+hd/2} c + x_i s), or by
  // the inverse angle when `inverse` (the transpose, for gradients).
  void rotate(const float *src, int64_t srcLd, float *dst, int64_t dstLd,
              int64_t rows, int64_t count, bool inverse) const {
    for (int64_t t = 0; t < rows; ++t) {
      const double *c = cos.data() + t * half, *s = sin.data() + t * half;
      const float *in = src + t * srcLd;
      float *out = dst + t * dstLd;
      for (int64_t h = 0; h < count; h += 2 * half)
        for (int64_t i = 0; i < half; ++i) {
          double x1 = in[h + i], x2 = in[h + i + half];
          double sn = inverse ? -s[i] : s[i];
          out[h + i] = static_cast<float>(x1 * c[i] - x2 * sn);
          out[h + i + half] = static_cast<float>(x2 * c[i] + x1 * sn);
        }
    }
  }
};

// Row i of the s x s `probs` becomes the softmax of its entries 0..i (the
// maximum subtracted, the denominator summed in double); entries past i
// become 0. Every loop runs over the whole row (the masked entries set to
// -inf, whose exp is exactly 0 and adds nothing to the sum): no ragged
// tails, the same floats as over 0..i.
PIPER_SIMD void causalSoftmax(float *probs, int64_t s) {
  const float minusInf = -__builtin_inff();
  for (int64_t i = 0; i < s; ++i) {
    float *__restrict row = probs + i * s;
    for (int64_t j = i + 1; j < s; ++j)
      row[j] = minusInf;
    float rowMax = maxOfInline(row, s);
    for (int64_t j = 0; j < s; ++j)
      row[j] = fastExp(row[j] - rowMax);
    float inv = static_cast<float>(1.0 / sumDoubleInline(row, s));
    for (int64_t j = 0; j < s; ++j)
      row[j] *= inv;
  }
}

// Softmax backward of the s x s causal `probs`, with the score scale folded
// in: row i of dp becomes scale * p * (dp - <p, dp>) over j <= i; masked
// entries have p = 0 and become 0.
PIPER_SIMD void causalSoftmaxGrad(const float *probs, float *dprobs, int64_t s,
                                  float scale) {
  for (int64_t i = 0; i < s; ++i) {
    const float *__restrict p = probs + i * s;
    float *__restrict dp = dprobs + i * s;
    // Masked entries have p = 0 and add nothing to the dot.
    double dot = dotDoubleInline(p, dp, s);
    for (int64_t j = 0; j < s; ++j)
      dp[j] = j <= i ? static_cast<float>(scale * p[j] * (dp[j] - dot)) : 0.0f;
  }
}

// probs = causal softmax(scale * q k^T) for one (sequence, head); q and k
// point at the head's first row with leading dimensions ldq and ldk.
void causalProbs(const AttentionDims &d, const float *q, int64_t ldq,
                 const float *k, int64_t ldk, float scale, float *probs) {
  int64_t s = d.seq;
  gemm(false, true, s, s, d.headDim, scale, q, ldq, k, ldk, 0.0f, probs, s);
  causalSoftmax(probs, s);
}

// The (possibly rotated) q and k of one sequence: without rotary embeddings
// they point into qkv, with them into rotated copies.
struct SequenceQK {
  const float *q = nullptr, *k = nullptr;
  int64_t ldq = 0, ldk = 0;
  std::vector<float> qRot, kRot;

  void load(const AttentionDims &d, const RopeTable &rope, const float *rows) {
    if (d.ropeTheta == 0) {
      q = rows;
      k = rows + d.qCols;
      ldq = ldk = d.cols;
      return;
    }
    qRot.resize(d.seq * d.qCols);
    kRot.resize(d.seq * d.kvCols);
    rope.rotate(rows, d.cols, qRot.data(), d.qCols, d.seq, d.qCols, false);
    rope.rotate(rows + d.qCols, d.cols, kRot.data(), d.kvCols, d.seq, d.kvCols,
                false);
    q = qRot.data();
    k = kRot.data();
    ldq = d.qCols;
    ldk = d.kvCols;
  }
};

} // namespace

Status checkAttention(const KernelArgs &a, AttentionDims &d) {
  PIPER_RETURN_IF_ERROR(expectCounts(a, 1, 1, 1));
  return attentionDims(a, a.inputs[0], a.outputs[0], "y", d);
}

Status checkAttentionGrad(const KernelArgs &a, AttentionDims &d) {
  PIPER_RETURN_IF_ERROR(expectCounts(a, 2, 2, 1));
  PIPER_RETURN_IF_ERROR(attentionDims(a, a.inputs[0], a.inputs[1], "dy", d));
  return expectTensor(a, a.outputs[0], "dqkv", plan::F32, {d.rows, d.cols});
}

Status attentionKernel(const KernelArgs &a) {
  AttentionDims d;
  PIPER_RETURN_IF_ERROR(checkAttention(a, d));
  const TensorRef &qkv = a.inputs[0], &y = a.outputs[0];
  if (d.batch == 0)
    return Status::ok();

  int64_t s = d.seq, hd = d.headDim;
  float scale = static_cast<float>(1.0 / std::sqrt(double(hd)));
  RopeTable rope(d);
  SequenceQK qk;
  std::vector<float> probs(s * s);
  for (int64_t b = 0; b < d.batch; ++b) {
    const float *rows = qkv.f32() + b * s * d.cols;
    const float *v = rows + d.qCols + d.kvCols;
    qk.load(d, rope, rows);
    for (int64_t h = 0; h < d.heads; ++h) {
      int64_t g = h / d.group();
      float *out = y.f32() + b * s * d.qCols + h * hd;
      causalProbs(d, qk.q + h * hd, qk.ldq, qk.k + g * hd, qk.ldk, scale,
                  probs.data());
      gemm(false, false, s, hd, s, 1.0f, probs.data(), s, v + g * hd, d.cols,
           0.0f, out, d.qCols);
    }
  }
  return Status::ok();
}

Status attentionGradKernel(const KernelArgs &a) {
  AttentionDims d;
  PIPER_RETURN_IF_ERROR(checkAttentionGrad(a, d));
  const TensorRef &qkv = a.inputs[0], &dy = a.inputs[1], &dqkv = a.outputs[0];
  if (d.batch == 0)
    return Status::ok();

  int64_t s = d.seq, hd = d.headDim;
  bool rotary = d.ropeTheta != 0;
  float scale = static_cast<float>(1.0 / std::sqrt(double(hd)));
  RopeTable rope(d);
  SequenceQK qk;
  std::vector<float> probs(s * s), dprobs(s * s);
  // Gradients of the rotated q and k, rotated back once per sequence.
  std::vector<float> dqRot(rotary ? s * d.qCols : 0),
      dkRot(rotary ? s * d.kvCols : 0);
  for (int64_t b = 0; b < d.batch; ++b) {
    const float *rows = qkv.f32() + b * s * d.cols;
    const float *v = rows + d.qCols + d.kvCols;
    float *drows = dqkv.f32() + b * s * d.cols;
    float *dq = rotary ? dqRot.data() : drows;
    float *dk = rotary ? dkRot.data() : drows + d.qCols;
    float *dv = drows + d.qCols + d.kvCols;
    int64_t lddq = rotary ? d.qCols : d.cols, lddk = rotary ? d.kvCols : d.cols;
    qk.load(d, rope, rows);
    for (int64_t h = 0; h < d.heads; ++h) {
      int64_t g = h / d.group();
      // The first query head of a group overwrites its kv head's dK and dV;
      // the others add to them, in head order.
      float beta = h % d.group() == 0 ? 0.0f : 1.0f;
      const float *q = qk.q + h * hd, *k = qk.k + g * hd;
      const float *dyb = dy.f32() + b * s * d.qCols + h * hd;

      causalProbs(d, q, qk.ldq, k, qk.ldk, scale, probs.data());
      // dV = P^T dY and dP = dY V^T.
      gemm(true, false, s, hd, s, 1.0f, probs.data(), s, dyb, d.qCols, beta,
           dv + g * hd, d.cols);
      gemm(false, true, s, s, hd, 1.0f, dyb, d.qCols, v + g * hd, d.cols, 0.0f,
           dprobs.data(), s);
      // Softmax backward, with the score scale folded in so that it need
      // not be applied to dQ and dK; masked entries have P = 0 and stay 0.
      causalSoftmaxGrad(probs.data(), dprobs.data(), s, scale);
      // dQ = dS K and dK = dS^T Q.
      gemm(false, false, s, hd, s, 1.0f, dprobs.data(), s, k, qk.ldk, 0.0f,
           dq + h * hd, lddq);
      gemm(true, false, s, hd, s, 1.0f, dprobs.data(), s, q, qk.ldq, beta,
           dk + g * hd, lddk);
    }
    if (rotary) {
      rope.rotate(dq, d.qCols, drows, d.cols, s, d.qCols, true);
      rope.rotate(dk, d.kvCols, drows + d.qCols, d.cols, s, d.kvCols, true);
    }
  }
  return Status::ok();
}

} // namespace piper::runtime::detail
