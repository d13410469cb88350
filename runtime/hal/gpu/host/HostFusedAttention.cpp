// The emulation's fused attention: see HostFusedAttention.h.
#include "runtime/hal/gpu/host/HostFusedAttention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "runtime/hal/gpu/ElementwiseMath.h"
#include "runtime/hal/gpu/host/HostCapture.h"

namespace piper::runtime::hal::PIPER_GPU_NS {

namespace {

class HostFusedAttention final : public FusedAttention {
public:
  explicit HostFusedAttention(const FusedAttentionShape &s) : s(s) {}
  size_t workspaceBytes() const override { return 0; }

  Status forward(const Context &ctx, const uint16_t *qkv, uint16_t *y,
                 float *stats, void *) const override {
    if (ctx.timer)
      PIPER_RETURN_IF_ERROR(ctx.timer->begin(ctx));
    runOrRecord([this, qkv, y, stats] { runForward(qkv, y, stats); });
    return ctx.timer ? ctx.timer->end(ctx, "fused_attention_forward (model)")
                     : Status::ok();
  }

  Status backward(const Context &ctx, const uint16_t *qkv, const uint16_t *y,
                  const uint16_t *dy, const float *, uint16_t *dqkv,
                  void *) const override {
    if (ctx.timer)
      PIPER_RETURN_IF_ERROR(ctx.timer->begin(ctx));
    runOrRecord([this, qkv, y, dy, dqkv] { runBackward(qkv, y, dy, dqkv); });
    return ctx.timer ? ctx.timer->end(ctx, "fused_attention_backward (model)")
                     : Status::ok();
  }

private:
  void runForward(const uint16_t *qkv, uint16_t *y, float *stats) const {
    std::vector<double> p(static_cast<size_t>(s.seq));
    for (int64_t b = 0; b < s.batch; ++b)
      for (int64_t h = 0; h < s.heads; ++h)
        for (int64_t i = 0; i < s.seq; ++i) {
          double lse = probabilities(qkv, b, h, i, p);
          stats[(b * s.heads + h) * s.seq + i] = static_cast<float>(lse);
          for (int64_t d = 0; d < s.headDim; ++d) {
            double acc = 0;
            for (int64_t j = 0; j <= i; ++j)
              acc += p[j] * at(qkv, b, j, vCol(h) + d);
            y[(b * s.seq + i) * yCols() + h * s.headDim + d] =
                toBf16(static_cast<float>(acc));
          }
        }
  }

  // dS_ij = P_ij (<dy_i, v_j> - <dy_i, y_i>), dq_i = scale sum_j dS_ij k_j,
  // dk_j = scale sum_i dS_ij q_i and dv_j = sum_i P_ij dy_i over the
  // group's query heads; P recomputed from qkv (as cuDNN does from the
  // statistics).
  void runBackward(const uint16_t *qkv, const uint16_t *y, const uint16_t *dy,
                   uint16_t *dqkv) const {
    const int64_t cols = qkvCols(), hd = s.headDim;
    std::vector<double> grad(static_cast<size_t>(s.batch * s.seq * cols), 0.0);
    std::vector<double> p(static_cast<size_t>(s.seq));
    for (int64_t b = 0; b < s.batch; ++b)
      for (int64_t h = 0; h < s.heads; ++h)
        for (int64_t i = 0; i < s.seq; ++i) {
          probabilities(qkv, b, h, i, p);
          const int64_t yRow = (b * s.seq + i) * yCols() + h * hd;
          double dOut = 0;
          for (int64_t d = 0; d < hd; ++d)
            dOut += double(fromBf16(dy[yRow + d])) * fromBf16(y[yRow + d]);
          double *gq =
              &grad[static_cast<size_t>((b * s.seq + i) * cols + h * hd)];
          for (int64_t j = 0; j <= i; ++j) {
            double dp = 0;
            for (int64_t d = 0; d < hd; ++d)
              dp += double(fromBf16(dy[yRow + d])) * at(qkv, b, j, vCol(h) + d);
            double ds = p[j] * (dp - dOut);
            double *gk =
                &grad[static_cast<size_t>((b * s.seq + j) * cols + kCol(h))];
            double *gv =
                &grad[static_cast<size_t>((b * s.seq + j) * cols + vCol(h))];
            for (int64_t d = 0; d < hd; ++d) {
              gq[d] += s.scale * ds * at(qkv, b, j, kCol(h) + d);
              gk[d] += s.scale * ds * at(qkv, b, i, h * hd + d);
              gv[d] += p[j] * fromBf16(dy[yRow + d]);
            }
          }
        }
    for (size_t e = 0; e < grad.size(); ++e)
      dqkv[e] = toBf16(static_cast<float>(grad[e]));
  }

  int64_t qkvCols() const { return (s.heads + 2 * s.kvHeads) * s.headDim; }
  int64_t yCols() const { return s.heads * s.headDim; }
  int64_t group() const { return s.heads / s.kvHeads; }
  int64_t kCol(int64_t h) const { return (s.heads + h / group()) * s.headDim; }
  int64_t vCol(int64_t h) const {
    return (s.heads + s.kvHeads + h / group()) * s.headDim;
  }
  double at(const uint16_t *qkv, int64_t b, int64_t t, int64_t col) const {
    return fromBf16(qkv[(b * s.seq + t) * qkvCols() + col]);
  }
  /// p[0..i] = the softmax of query (b, h, i)'s scaled scores over keys
  /// 0..i; returns their log-sum-exp.
  double probabilities(const uint16_t *qkv, int64_t b, int64_t h, int64_t i,
                       std::vector<double> &p) const {
    double m = -std::numeric_limits<double>::infinity();
    for (int64_t j = 0; j <= i; ++j) {
      double dot = 0;
      for (int64_t d = 0; d < s.headDim; ++d)
        dot += at(qkv, b, i, h * s.headDim + d) * at(qkv, b, j, kCol(h) + d);
      p[j] = double(s.scale) * dot;
      m = std::max(m, p[j]);
    }
    double sum = 0;
    for (int64_t j = 0; j <= i; ++j)
      sum += (p[j] = std::exp(p[j] - m));
    for (int64_t j = 0; j <= i; ++j)
      p[j] /= sum;
    return m + std::log(sum);
  }

  FusedAttentionShape s;
};

} // namespace

Status HostFusedAttentionProvider::get(const Context &,
                                       const FusedAttentionShape &s,
                                       const FusedAttention *&out) {
  std::lock_guard<std::mutex> lock(mu);
  auto key =
      std::make_tuple(s.batch, s.seq, s.heads, s.kvHeads, s.headDim, s.scale);
  std::unique_ptr<FusedAttention> &model = models[key];
  if (!model)
    model = std::make_unique<HostFusedAttention>(s);
  out = model.get();
  return Status::ok();
}

} // namespace piper::runtime::hal::PIPER_GPU_NS
