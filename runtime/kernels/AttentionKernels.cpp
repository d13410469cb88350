// Causal multi-head self-attention over a packed [q | k | v] projection,
// forward and backward (the backward recomputes the probabilities).
#include <algorithm>
#include <cmath>
#include <limits>

#include "runtime/kernels/KernelUtil.h"

namespace piper::runtime::detail {

namespace {

struct AttentionDims {
  int64_t rows = 0;   // N = batch * seq
  int64_t hidden = 0; // H = heads * headDim
  int64_t heads = 0;
  int64_t headDim = 0;
  int64_t seq = 0;
  int64_t batch = 0;
};

Status attentionDims(const KernelArgs &a, const TensorRef &qkv,
                     AttentionDims &d) {
  int64_t cols = 0;
  PIPER_RETURN_IF_ERROR(expectMatrix(a, qkv, "qkv", plan::F32, d.rows, cols));
  PIPER_RETURN_IF_ERROR(readPositiveInt(a, "heads", std::nullopt, d.heads));
  PIPER_RETURN_IF_ERROR(readPositiveInt(a, "seq", std::nullopt, d.seq));
  if (cols == 0 || cols % 3 != 0)
    return a.error("qkv has " + std::to_string(cols) +
                   " columns, expected a positive multiple of 3");
  d.hidden = cols / 3;
  if (d.hidden % d.heads != 0)
    return a.error("hidden size " + std::to_string(d.hidden) +
                   " is not divisible by heads " + std::to_string(d.heads));
  if (d.rows % d.seq != 0)
    return a.error("qkv has " + std::to_string(d.rows) +
                   " rows, not a multiple of seq " + std::to_string(d.seq));
  d.headDim = d.hidden / d.heads;
  d.batch = d.rows / d.seq;
  return expectBlasDims(a, {d.seq, cols});
}

// probs = causal softmax(scale * q k^T) for one (sequence, head); q and k
// point into qkv rows with leading dimension 3H.
void causalProbs(const AttentionDims &d, const float *q, const float *k,
                 float scale, float *probs) {
  int64_t s = d.seq, ld = 3 * d.hidden;
  gemm(false, true, s, s, d.headDim, scale, q, ld, k, ld, 0.0f, probs, s);
  for (int64_t i = 0; i < s; ++i) {
    float *row = probs + i * s;
    float rowMax = -std::numeric_limits<float>::infinity();
    for (int64_t j = 0; j <= i; ++j)
      rowMax = std::max(rowMax, row[j]);
    double sum = 0;
    for (int64_t j = 0; j <= i; ++j) {
      row[j] = std::exp(row[j] - rowMax);
      sum += row[j];
    }
    float inv = static_cast<float>(1.0 / sum);
    for (int64_t j = 0; j <= i; ++j)
      row[j] *= inv;
    for (int64_t j = i + 1; j < s; ++j)
      row[j] = 0.0f;
  }
}

} // namespace

Status attentionKernel(const KernelArgs &a) {
  PIPER_RETURN_IF_ERROR(expectCounts(a, 1, 1, 1));
  const TensorRef &qkv = a.inputs[0], &y = a.outputs[0];
  AttentionDims d;
  PIPER_RETURN_IF_ERROR(attentionDims(a, qkv, d));
  PIPER_RETURN_IF_ERROR(expectTensor(a, y, "y", plan::F32, {d.rows, d.hidden}));

  int64_t s = d.seq, h3 = 3 * d.hidden;
  float scale = static_cast<float>(1.0 / std::sqrt(double(d.headDim)));
  std::vector<float> probs(s * s);
  for (int64_t b = 0; b < d.batch; ++b) {
    for (int64_t h = 0; h < d.heads; ++h) {
      const float *q = qkv.f32() + b * s * h3 + h * d.headDim;
      const float *k = q + d.hidden;
      const float *v = q + 2 * d.hidden;
      float *out = y.f32() + b * s * d.hidden + h * d.headDim;
      causalProbs(d, q, k, scale, probs.data());
      gemm(false, false, s, d.headDim, s, 1.0f, probs.data(), s, v, h3, 0.0f,
           out, d.hidden);
    }
  }
  return Status::ok();
}

Status attentionGradKernel(const KernelArgs &a) {
  PIPER_RETURN_IF_ERROR(expectCounts(a, 2, 2, 1));
  const TensorRef &qkv = a.inputs[0], &dy = a.inputs[1], &dqkv = a.outputs[0];
  AttentionDims d;
  PIPER_RETURN_IF_ERROR(attentionDims(a, qkv, d));
  PIPER_RETURN_IF_ERROR(
      expectTensor(a, dy, "dy", plan::F32, {d.rows, d.hidden}));
  PIPER_RETURN_IF_ERROR(
      expectTensor(a, dqkv, "dqkv", plan::F32, {d.rows, 3 * d.hidden}));

  int64_t s = d.seq, h3 = 3 * d.hidden;
  float scale = static_cast<float>(1.0 / std::sqrt(double(d.headDim)));
  std::vector<float> probs(s * s), dprobs(s * s);
  for (int64_t b = 0; b < d.batch; ++b) {
    for (int64_t h = 0; h < d.heads; ++h) {
      int64_t offset = b * s * h3 + h * d.headDim;
      const float *q = qkv.f32() + offset;
      const float *k = q + d.hidden;
      const float *v = q + 2 * d.hidden;
      float *dq = dqkv.f32() + offset;
      float *dk = dq + d.hidden;
      float *dv = dq + 2 * d.hidden;
      const float *dyb = dy.f32() + b * s * d.hidden + h * d.headDim;

      causalProbs(d, q, k, scale, probs.data());
      // dV = P^T dY and dP = dY V^T.
      gemm(true, false, s, d.headDim, s, 1.0f, probs.data(), s, dyb, d.hidden,
           0.0f, dv, h3);
      gemm(false, true, s, s, d.headDim, 1.0f, dyb, d.hidden, v, h3, 0.0f,
           dprobs.data(), s);
      // Softmax backward, with the score scale folded in so that it need
      // not be applied to dQ and dK; masked entries have P = 0 and stay 0.
      for (int64_t i = 0; i < s; ++i) {
        const float *p = probs.data() + i * s;
        float *dp = dprobs.data() + i * s;
        double dot = 0;
        for (int64_t j = 0; j <= i; ++j)
          dot += double(p[j]) * dp[j];
        for (int64_t j = 0; j <= i; ++j)
          dp[j] = static_cast<float>(scale * p[j] * (dp[j] - dot));
        for (int64_t j = i + 1; j < s; ++j)
          dp[j] = 0.0f;
      }
      // dQ = dS K and dK = dS^T Q.
      gemm(false, false, s, d.headDim, s, 1.0f, dprobs.data(), s, k, h3, 0.0f,
           dq, h3);
      gemm(true, false, s, d.headDim, s, 1.0f, dprobs.data(), s, q, h3, 0.0f,
           dk, h3);
    }
  }
  return Status::ok();
}

} // namespace piper::runtime::detail
