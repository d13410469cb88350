// Causal multi-head self-attention over a packed [q | k | v] projection, with
// optional grouped-query heads and rotary position embeddings, forward and
// backward (the backward recomputes the probabilities).
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "proto/PlanShards.h"
#include "runtime/kernels/AttentionChecks.h"
#include "runtime/kernels/KernelUtil.h"
#include "runtime/kernels/VecMath.h"
#include "support/Precision.h"

namespace piper::runtime::detail {

namespace {

// Reads the attributes and derives the sizes from qkv and `out` ([N, heads*hd]:
// y of the forward, dy of the backward); the batch is the caller's. A
// `packable` out, and with `packableQkv` qkv, may be packed bf16 in mixed
// precision.
Status attentionShape(const KernelArgs &a, const TensorRef &qkv,
                      const TensorRef &out, const char *outName,
                      AttentionDims &d, bool packable = false,
                      bool packableQkv = false) {
  PIPER_RETURN_IF_ERROR(expectMatrix(
      a, qkv, "qkv", packableQkv ? packableDType(a, qkv) : plan::F32, d.rows,
      d.cols));
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
  PIPER_RETURN_IF_ERROR(
      readFloat(a, KernelAttr::kRopeFactor, 0.0, d.rope.factor));
  if (d.rope.factor != 0) {
    int64_t original = 0;
    PIPER_RETURN_IF_ERROR(readFloat(a, KernelAttr::kRopeLowFreqFactor,
                                    std::nullopt, d.rope.lowFreqFactor));
    PIPER_RETURN_IF_ERROR(readFloat(a, KernelAttr::kRopeHighFreqFactor,
                                    std::nullopt, d.rope.highFreqFactor));
    PIPER_RETURN_IF_ERROR(readPositiveInt(
        a, KernelAttr::kRopeOriginalMaxPosition, std::nullopt, original));
    d.rope.originalMaxPosition = double(original);
    if (!(d.rope.factor > 0) || !(d.rope.lowFreqFactor > 0) ||
        !(d.rope.highFreqFactor > d.rope.lowFreqFactor) ||
        !std::isfinite(d.rope.factor) || !std::isfinite(d.rope.highFreqFactor))
      return a.error("attributes 'rope_factor', 'rope_low_freq_factor' and "
                     "'rope_high_freq_factor' must satisfy factor > 0 and 0 "
                     "< low < high");
    if (d.ropeTheta == 0)
      return a.error("attribute 'rope_factor' needs 'rope_theta'");
  }

  int64_t outRows = 0;
  PIPER_RETURN_IF_ERROR(expectMatrix(
      a, out, outName, packable ? packableDType(a, out) : plan::F32, outRows,
      d.qCols));
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
  return Status::ok();
}

// attentionShape, then the batch: whole sequences of `seq` rows.
Status attentionDims(const KernelArgs &a, const TensorRef &qkv,
                     const TensorRef &out, const char *outName,
                     AttentionDims &d, bool packable = false) {
  // qkv may be packed: the GEMM before attention stores it so where only
  // attention and attention_grad read it (hal::Device::readsPackedInput).
  PIPER_RETURN_IF_ERROR(
      attentionShape(a, qkv, out, outName, d, packable, true));
  if (d.rows % d.seq != 0)
    return a.error("qkv has " + std::to_string(d.rows) +
                   " rows, not a multiple of seq " + std::to_string(d.seq));
  d.batch = d.rows / d.seq;
  return expectBlasDims(a, {d.seq, d.cols});
}

// attentionShape, then the ring step (docs/context-parallel.md): cp
// members, step in [0, cp), the context's member, and the batch of
// sequences of seq / cp local rows.
Status attentionBlockDims(const KernelArgs &a, const TensorRef &qkv,
                          const TensorRef &out, const char *outName,
                          bool backward, AttentionBlockDims &d) {
  PIPER_RETURN_IF_ERROR(attentionShape(a, qkv, out, outName, d));
  PIPER_RETURN_IF_ERROR(
      readPositiveInt(a, KernelAttr::kCp, std::nullopt, d.cp));
  PIPER_RETURN_IF_ERROR(readInt(a, KernelAttr::kStep, std::nullopt, d.step));
  if (d.step < 0 || d.step >= d.cp)
    return a.error("attribute 'step' " + std::to_string(d.step) +
                   " is not in [0, cp " + std::to_string(d.cp) + ")");
  if (d.seq % (2 * d.cp) != 0)
    return a.error("seq " + std::to_string(d.seq) +
                   " is not a multiple of 2 x cp " + std::to_string(d.cp));
  d.member = a.ctx.contextMember;
  if (d.member < 0 || d.member >= d.cp)
    return a.error("context member " + std::to_string(d.member) +
                   " is not one of " + std::to_string(d.cp));
  // The forward ring passes key/value shards to the next member, the
  // backward ring to the previous one.
  d.owner = backward ? (d.member + d.step) % d.cp
                     : (d.member - d.step % d.cp + d.cp) % d.cp;
  d.local = d.seq / d.cp;
  if (d.rows % d.local != 0)
    return a.error("qkv has " + std::to_string(d.rows) +
                   " rows, not a multiple of the member's seq / cp " +
                   std::to_string(d.local));
  d.batch = d.rows / d.local;
  return expectBlasDims(a, {d.local, d.cols});
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
      double freq = ropeFrequency(d.ropeTheta, d.headDim, i, d.rope);
      for (int64_t t = 0; t < d.seq; ++t) {
        double angle = double(t) * freq;
        cos[t * half + i] = std::cos(angle);
        sin[t * half + i] = std::sin(angle);
      }
    }
  }

  // Rotates the heads of `count` columns of `rows` rows at positions 0..rows-1
  // (or pos[0..rows-1]):
  // (x_i, x_{i+hd/2}) -> (x_i c - x_{i+hd/2} s, x_{i+hd/2} c + x_i s), or by
  // the inverse angle when `inverse` (the transpose, for gradients).
  void rotate(const float *src, int64_t srcLd, float *dst, int64_t dstLd,
              int64_t rows, int64_t count, bool inverse,
              const int64_t *pos = nullptr) const {
    for (int64_t t = 0; t < rows; ++t) {
      int64_t p = pos ? pos[t] : t;
      const double *c = cos.data() + p * half, *s = sin.data() + p * half;
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
// tails, the same floats as over 0..i. With `lse`, lse[i] becomes the row's
// log-sum-exp, max + log(sum), as the ring's blocks compute it.
PIPER_SIMD void causalSoftmax(float *probs, int64_t s, float *lse) {
  const float minusInf = -__builtin_inff();
  for (int64_t i = 0; i < s; ++i) {
    float *__restrict row = probs + i * s;
    for (int64_t j = i + 1; j < s; ++j)
      row[j] = minusInf;
    float rowMax = maxOfInline(row, s);
    for (int64_t j = 0; j < s; ++j)
      row[j] = fastExp(row[j] - rowMax);
    double sum = sumDoubleInline(row, s);
    float inv = static_cast<float>(1.0 / sum);
    for (int64_t j = 0; j < s; ++j)
      row[j] *= inv;
    if (lse)
      lse[i] = static_cast<float>(double(rowMax) + std::log(sum));
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
                 const float *k, int64_t ldk, float scale, float *probs,
                 float *lse = nullptr) {
  int64_t s = d.seq;
  gemm(false, true, s, s, d.headDim, scale, q, ldq, k, ldk, 0.0f, probs, s);
  causalSoftmax(probs, s, lse);
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

// The global positions of a member's local rows of one sequence.
std::vector<int64_t> memberPositions(const AttentionBlockDims &d,
                                     int64_t member) {
  std::vector<int64_t> pos(d.local);
  for (int64_t t = 0; t < d.local; ++t)
    pos[t] = plan::contextPosition(d.seq, d.cp, member, t);
  return pos;
}

// q and k of one sequence's local rows for a ring step: q rotated at the
// member's positions, k (from the kv shard, [local, 2 kvCols]) at the
// owner's.
struct BlockQK {
  const float *q = nullptr, *k = nullptr;
  int64_t ldq = 0, ldk = 0;
  std::vector<float> qRot, kRot;

  void load(const AttentionBlockDims &d, const RopeTable &rope,
            const float *rows, const float *kvRows, const int64_t *qpos,
            const int64_t *kpos) {
    if (d.ropeTheta == 0) {
      q = rows;
      k = kvRows;
      ldq = d.cols;
      ldk = 2 * d.kvCols;
      return;
    }
    qRot.resize(d.local * d.qCols);
    kRot.resize(d.local * d.kvCols);
    rope.rotate(rows, d.cols, qRot.data(), d.qCols, d.local, d.qCols, false,
                qpos);
    rope.rotate(kvRows, 2 * d.kvCols, kRot.data(), d.kvCols, d.local, d.kvCols,
                false, kpos);
    q = qRot.data();
    k = kRot.data();
    ldq = d.qCols;
    ldk = d.kvCols;
  }
};

// Row i of the l x l `probs` (scaled scores) becomes the softmax of its
// entries j with qpos[i] >= kpos[j], the others 0, and lse[i * lseLd] the
// log-sum-exp of those scores; a row that sees no key becomes 0 with lse
// -inf (it adds nothing when the ring's steps are combined).
void maskedSoftmax(float *probs, int64_t l, const int64_t *qpos,
                   const int64_t *kpos, float *lse, int64_t lseLd) {
  const float minusInf = -__builtin_inff();
  for (int64_t i = 0; i < l; ++i) {
    float *row = probs + i * l;
    for (int64_t j = 0; j < l; ++j)
      if (qpos[i] < kpos[j])
        row[j] = minusInf;
    float rowMax = maxOfInline(row, l);
    if (rowMax == minusInf) {
      std::fill(row, row + l, 0.0f);
      lse[i * lseLd] = minusInf;
      continue;
    }
    for (int64_t j = 0; j < l; ++j)
      row[j] = fastExp(row[j] - rowMax);
    double sum = sumDoubleInline(row, l);
    float inv = static_cast<float>(1.0 / sum);
    for (int64_t j = 0; j < l; ++j)
      row[j] *= inv;
    lse[i * lseLd] = static_cast<float>(double(rowMax) + std::log(sum));
  }
}

} // namespace

void storeRingLse(float *lse, int64_t heads, int64_t row, int64_t h, float v) {
  float *p = lse + row * 2 * heads;
  if (!std::isfinite(v)) {
    p[h] = v;
    p[heads + h] = 0.0f;
    return;
  }
  float hi = roundToBf16(v);
  p[h] = hi;
  p[heads + h] = v - hi; // exact: hi is v to 8 significant bits
}

float loadRingLse(const float *lse, int64_t heads, int64_t row, int64_t h) {
  const float *p = lse + row * 2 * heads;
  return p[h] + p[heads + h];
}

Status checkAttentionBlock(const KernelArgs &a, AttentionBlockDims &d) {
  PIPER_RETURN_IF_ERROR(expectCounts(a, 2, 4, 2));
  if (a.inputs.size() == 3)
    return a.error("takes qkv and kv, and o and lse to combine with after "
                   "step 0: got 3 inputs");
  PIPER_RETURN_IF_ERROR(
      attentionBlockDims(a, a.inputs[0], a.outputs[0], "o", false, d));
  PIPER_RETURN_IF_ERROR(
      expectTensor(a, a.inputs[1], "kv", plan::F32, {d.rows, 2 * d.kvCols}));
  if (a.inputs.size() == 4) {
    PIPER_RETURN_IF_ERROR(
        expectTensor(a, a.inputs[2], "o", plan::F32, {d.rows, d.qCols}));
    PIPER_RETURN_IF_ERROR(
        expectTensor(a, a.inputs[3], "lse", plan::F32, {d.rows, 2 * d.heads}));
  }
  return expectTensor(a, a.outputs[1], "lse", plan::F32, {d.rows, 2 * d.heads});
}

Status checkAttentionBlockGrad(const KernelArgs &a, AttentionBlockDims &d) {
  PIPER_RETURN_IF_ERROR(expectCounts(a, 5, 7, 2));
  if (a.inputs.size() == 6)
    return a.error("takes qkv, kv, y, lse and dy, and dq and dkv to add to "
                   "after step 0: got 6 inputs");
  PIPER_RETURN_IF_ERROR(
      attentionBlockDims(a, a.inputs[0], a.inputs[4], "dy", true, d));
  const std::vector<int64_t> kvShape{d.rows, 2 * d.kvCols},
      qShape{d.rows, d.qCols};
  PIPER_RETURN_IF_ERROR(expectTensor(a, a.inputs[1], "kv", plan::F32, kvShape));
  PIPER_RETURN_IF_ERROR(expectTensor(a, a.inputs[2], "y", plan::F32, qShape));
  PIPER_RETURN_IF_ERROR(
      expectTensor(a, a.inputs[3], "lse", plan::F32, {d.rows, 2 * d.heads}));
  if (a.inputs.size() == 7) {
    PIPER_RETURN_IF_ERROR(
        expectTensor(a, a.inputs[5], "dq", plan::F32, qShape));
    PIPER_RETURN_IF_ERROR(
        expectTensor(a, a.inputs[6], "dkv", plan::F32, kvShape));
  }
  PIPER_RETURN_IF_ERROR(expectTensor(a, a.outputs[0], "dq", plan::F32, qShape));
  return expectTensor(a, a.outputs[1], "dkv", plan::F32, kvShape);
}

Status checkAttention(const KernelArgs &a, AttentionDims &d) {
  PIPER_RETURN_IF_ERROR(expectCounts(a, 1, 1, 2));
  // y may be packed: an activation that only GEMMs and attention_grad read
  // (hal::Device::writesPackedOutput).
  PIPER_RETURN_IF_ERROR(
      attentionDims(a, a.inputs[0], a.outputs[0], "y", d, true));
  return expectTensor(a, a.outputs[1], "lse", plan::F32, {d.rows, 2 * d.heads});
}

Status checkAttentionGrad(const KernelArgs &a, AttentionDims &d) {
  PIPER_RETURN_IF_ERROR(expectCounts(a, 4, 4, 1));
  // dy may be packed too (linear_grad_input's packed dx).
  PIPER_RETURN_IF_ERROR(
      attentionDims(a, a.inputs[0], a.inputs[3], "dy", d, true));
  PIPER_RETURN_IF_ERROR(expectTensor(
      a, a.inputs[1], "y", packableDType(a, a.inputs[1]), {d.rows, d.qCols}));
  PIPER_RETURN_IF_ERROR(
      expectTensor(a, a.inputs[2], "lse", plan::F32, {d.rows, 2 * d.heads}));
  // dqkv may be stored packed in mixed precision (read only by the QKV
  // projection's GEMMs and bias sums: hal::Device::writesPackedOutput).
  return expectTensor(a, a.outputs[0], "dqkv", packableDType(a, a.outputs[0]),
                      {d.rows, d.cols});
}

Status attentionKernel(const KernelArgs &a) {
  AttentionDims d;
  PIPER_RETURN_IF_ERROR(checkAttention(a, d));
  const TensorRef &qkv = a.inputs[0], &y = a.outputs[0], &lse = a.outputs[1];
  if (d.batch == 0)
    return Status::ok();
  // A packed y: computed here, then rounded and packed; a packed qkv:
  // unpacked.
  std::vector<float> packed, unpacked;
  float *yData = outputRow(y, 0, y.numel(), packed);
  const float *qkvData = fp32Data(qkv, unpacked);

  int64_t s = d.seq, hd = d.headDim;
  float scale = static_cast<float>(1.0 / std::sqrt(double(hd)));
  RopeTable rope(d);
  SequenceQK qk;
  std::vector<float> probs(s * s), rowLse(s);
  for (int64_t b = 0; b < d.batch; ++b) {
    const float *rows = qkvData + b * s * d.cols;
    const float *v = rows + d.qCols + d.kvCols;
    qk.load(d, rope, rows);
    for (int64_t h = 0; h < d.heads; ++h) {
      int64_t g = h / d.group();
      float *out = yData + b * s * d.qCols + h * hd;
      causalProbs(d, qk.q + h * hd, qk.ldq, qk.k + g * hd, qk.ldk, scale,
                  probs.data(), rowLse.data());
      gemm(false, false, s, hd, s, 1.0f, probs.data(), s, v + g * hd, d.cols,
           0.0f, out, d.qCols);
      for (int64_t i = 0; i < s; ++i)
        storeRingLse(lse.f32(), d.heads, b * s + i, h, rowLse[i]);
    }
  }
  storeRow(y, 0, y.numel(), y.numel(), yData);
  return Status::ok();
}

Status attentionGradKernel(const KernelArgs &a) {
  AttentionDims d;
  PIPER_RETURN_IF_ERROR(checkAttentionGrad(a, d));
  // The softmax is recomputed from q|k|v (the forward's y and lse, inputs 1
  // and 2, are for the fused kernels): the same numbers as ever.
  const TensorRef &qkv = a.inputs[0], &dy = a.inputs[3], &dqkv = a.outputs[0];
  if (d.batch == 0)
    return Status::ok();
  std::vector<float> unpacked, unpackedDy, packed;
  const float *qkvData = fp32Data(qkv, unpacked);
  const float *dyData = fp32Data(dy, unpackedDy);
  float *dqkvData = outputRow(dqkv, 0, dqkv.numel(), packed);

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
    const float *rows = qkvData + b * s * d.cols;
    const float *v = rows + d.qCols + d.kvCols;
    float *drows = dqkvData + b * s * d.cols;
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
      const float *dyb = dyData + b * s * d.qCols + h * hd;

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
  storeRow(dqkv, 0, dqkv.numel(), dqkv.numel(), dqkvData);
  return Status::ok();
}

// One ring step (docs/context-parallel.md): per (sequence, head) the
// block's softmax over the visible keys and its output, then combined with
// the steps before by their log-sum-exps:
// lse = log(e^lse_old + e^lse_b), o = e^(lse_old-lse) o_old + e^(lse_b-lse)
// o_b.
Status attentionBlockKernel(const KernelArgs &a) {
  AttentionBlockDims d;
  PIPER_RETURN_IF_ERROR(checkAttentionBlock(a, d));
  const TensorRef &qkv = a.inputs[0], &kv = a.inputs[1], &o = a.outputs[0],
                  &lse = a.outputs[1];
  if (d.batch == 0)
    return Status::ok();
  const int64_t l = d.local, hd = d.headDim, kvLd = 2 * d.kvCols;
  const float scale = static_cast<float>(1.0 / std::sqrt(double(hd)));
  RopeTable rope(d);
  std::vector<int64_t> qpos = memberPositions(d, d.member),
                       kpos = memberPositions(d, d.owner);
  BlockQK qk;
  std::vector<float> probs(l * l), lseBlock(d.rows * d.heads);
  for (int64_t b = 0; b < d.batch; ++b) {
    const float *rows = qkv.f32() + b * l * d.cols;
    const float *kvRows = kv.f32() + b * l * kvLd;
    qk.load(d, rope, rows, kvRows, qpos.data(), kpos.data());
    for (int64_t h = 0; h < d.heads; ++h) {
      int64_t g = h / d.group();
      gemm(false, true, l, l, hd, scale, qk.q + h * hd, qk.ldq, qk.k + g * hd,
           qk.ldk, 0.0f, probs.data(), l);
      maskedSoftmax(probs.data(), l, qpos.data(), kpos.data(),
                    lseBlock.data() + b * l * d.heads + h, d.heads);
      gemm(false, false, l, hd, l, 1.0f, probs.data(), l,
           kvRows + d.kvCols + g * hd, kvLd, 0.0f,
           o.f32() + b * l * d.qCols + h * hd, d.qCols);
    }
  }
  if (a.inputs.size() == 2) {
    for (int64_t r = 0; r < d.rows; ++r)
      for (int64_t h = 0; h < d.heads; ++h)
        storeRingLse(lse.f32(), d.heads, r, h, lseBlock[r * d.heads + h]);
    return Status::ok();
  }
  const float *oOld = a.inputs[2].f32(), *lseOld = a.inputs[3].f32();
  const float minusInf = -__builtin_inff();
  for (int64_t r = 0; r < d.rows; ++r)
    for (int64_t h = 0; h < d.heads; ++h) {
      float lb = lseBlock[r * d.heads + h];
      float la = loadRingLse(lseOld, d.heads, r, h);
      float *out = o.f32() + r * d.qCols + h * hd;
      const float *old = oOld + r * d.qCols + h * hd;
      if (lb == minusInf || la == minusInf) {
        if (lb == minusInf) {
          std::copy(old, old + hd, out);
          lb = la;
        }
        storeRingLse(lse.f32(), d.heads, r, h, lb);
        continue;
      }
      double hi = std::max<double>(la, lb), lo = std::min<double>(la, lb);
      double sum = hi + std::log1p(std::exp(lo - hi));
      double wa = std::exp(la - sum), wb = std::exp(lb - sum);
      for (int64_t c = 0; c < hd; ++c)
        out[c] = static_cast<float>(wa * old[c] + wb * out[c]);
      storeRingLse(lse.f32(), d.heads, r, h, static_cast<float>(sum));
    }
  return Status::ok();
}

// One backward ring step: the probabilities again from the final lse,
// P = exp(s - lse) on visible keys, then dV = P^T dY, dP = dY V^T,
// dS = scale P (dP - <dY, Y>), dQ = dS K, dK = dS^T Q, rotated back at the
// member's and the owner's positions, added to the given partial sums.
Status attentionBlockGradKernel(const KernelArgs &a) {
  AttentionBlockDims d;
  PIPER_RETURN_IF_ERROR(checkAttentionBlockGrad(a, d));
  const TensorRef &qkv = a.inputs[0], &kv = a.inputs[1], &y = a.inputs[2],
                  &lse = a.inputs[3], &dy = a.inputs[4], &dqOut = a.outputs[0],
                  &dkvOut = a.outputs[1];
  if (d.batch == 0)
    return Status::ok();
  const int64_t l = d.local, hd = d.headDim, kvLd = 2 * d.kvCols;
  const bool rotary = d.ropeTheta != 0;
  const float scale = static_cast<float>(1.0 / std::sqrt(double(hd)));
  RopeTable rope(d);
  std::vector<int64_t> qpos = memberPositions(d, d.member),
                       kpos = memberPositions(d, d.owner);
  BlockQK qk;
  std::vector<float> probs(l * l), dprobs(l * l), delta(l);
  std::vector<float> dqRot(rotary ? l * d.qCols : 0),
      dkRot(rotary ? l * d.kvCols : 0);
  for (int64_t b = 0; b < d.batch; ++b) {
    const float *rows = qkv.f32() + b * l * d.cols;
    const float *kvRows = kv.f32() + b * l * kvLd;
    float *dqRows = dqOut.f32() + b * l * d.qCols;
    float *dkvRows = dkvOut.f32() + b * l * kvLd;
    float *dq = rotary ? dqRot.data() : dqRows;
    float *dk = rotary ? dkRot.data() : dkvRows;
    const int64_t lddq = d.qCols, lddk = rotary ? d.kvCols : kvLd;
    qk.load(d, rope, rows, kvRows, qpos.data(), kpos.data());
    for (int64_t h = 0; h < d.heads; ++h) {
      int64_t g = h / d.group();
      // The first query head of a group overwrites its kv head's dK and
      // dV; the others add to them, in head order.
      float beta = h % d.group() == 0 ? 0.0f : 1.0f;
      const float *q = qk.q + h * hd, *k = qk.k + g * hd;
      const float *v = kvRows + d.kvCols + g * hd;
      const float *dyb = dy.f32() + b * l * d.qCols + h * hd;
      const float *yb = y.f32() + b * l * d.qCols + h * hd;
      gemm(false, true, l, l, hd, scale, q, qk.ldq, k, qk.ldk, 0.0f,
           probs.data(), l);
      for (int64_t i = 0; i < l; ++i) {
        float li = loadRingLse(lse.f32(), d.heads, b * l + i, h);
        float *row = probs.data() + i * l;
        for (int64_t j = 0; j < l; ++j)
          row[j] = qpos[i] >= kpos[j] ? fastExp(row[j] - li) : 0.0f;
        delta[i] = static_cast<float>(
            dotDoubleInline(dyb + i * d.qCols, yb + i * d.qCols, hd));
      }
      gemm(true, false, l, hd, l, 1.0f, probs.data(), l, dyb, d.qCols, beta,
           dkvRows + d.kvCols + g * hd, kvLd);
      gemm(false, true, l, l, hd, 1.0f, dyb, d.qCols, v, kvLd, 0.0f,
           dprobs.data(), l);
      for (int64_t i = 0; i < l; ++i)
        for (int64_t j = 0; j < l; ++j)
          dprobs[i * l + j] =
              scale * probs[i * l + j] * (dprobs[i * l + j] - delta[i]);
      gemm(false, false, l, hd, l, 1.0f, dprobs.data(), l, k, qk.ldk, 0.0f,
           dq + h * hd, lddq);
      gemm(true, false, l, hd, l, 1.0f, dprobs.data(), l, q, qk.ldq, beta,
           dk + g * hd, lddk);
    }
    if (rotary) {
      rope.rotate(dq, d.qCols, dqRows, d.qCols, l, d.qCols, true, qpos.data());
      rope.rotate(dk, d.kvCols, dkvRows, kvLd, l, d.kvCols, true, kpos.data());
    }
  }
  if (a.inputs.size() == 7) {
    const float *dqIn = a.inputs[5].f32(), *dkvIn = a.inputs[6].f32();
    for (int64_t i = 0, n = dqOut.numel(); i < n; ++i)
      dqOut.f32()[i] += dqIn[i];
    for (int64_t i = 0, n = dkvOut.numel(); i < n; ++i)
      dkvOut.f32()[i] += dkvIn[i];
  }
  return Status::ok();
}

} // namespace piper::runtime::detail
