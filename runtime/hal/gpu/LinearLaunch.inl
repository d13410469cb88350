// The linear and loss launchers' bodies, written once: included by
// Linear.cu (Exec = CudaExec) and LinearHost.cpp (Exec = HostExec), after
// `Exec` is declared in this namespace.

namespace piper::runtime::hal::PIPER_GPU_NS {

Status launchBroadcastRows(const Context &ctx, const float *b, float *y,
                           int64_t rows, int64_t cols) {
  return Exec(ctx).forEach("linear_bias", rows * cols,
                           [=] PIPER_LAMBDA(int64_t i) { y[i] = b[i % cols]; });
}

Status launchColumns(const Context &ctx, const float *in, int64_t rows,
                     int64_t wide, int64_t start, int64_t narrow, bool grad,
                     float *out) {
  if (!grad)
    return Exec(ctx).forEach(
        "columns", rows * narrow, [=] PIPER_LAMBDA(int64_t e) {
          out[e] = in[(e / narrow) * wide + start + e % narrow];
        });
  return Exec(ctx).forEach(
      "columns_grad", rows * wide, [=] PIPER_LAMBDA(int64_t e) {
        int64_t j = e % wide;
        out[e] = j >= start && j < start + narrow
                     ? in[(e / wide) * narrow + j - start]
                     : 0.0f;
      });
}

Status launchKvAssemble(const Context &ctx, const float *w, const float *pieces,
                        int64_t rows, int64_t query, int64_t piece,
                        int64_t share, int64_t group, float *y) {
  const int64_t hd = share * piece, cols = query + 2 * hd;
  return Exec(ctx).forEach(
      "tp_kv_assemble", rows * cols, [=] PIPER_LAMBDA(int64_t e) {
        int64_t i = e / cols, j = e % cols;
        if (j < query) {
          y[e] = w[i * (query + 2 * piece) + j];
          return;
        }
        int64_t t = j - query, kv = t / hd, s = (t % hd) / piece,
                c = t % piece;
        y[e] = pieces[((group * share + s) * rows + i) * 2 * piece +
                      kv * piece + c];
      });
}

Status launchKvAssembleGrad(const Context &ctx, const float *dy, int64_t rows,
                            int64_t query, int64_t piece, int64_t share,
                            int64_t members, int64_t group, float *dpieces) {
  const int64_t hd = share * piece, cols = query + 2 * hd;
  return Exec(ctx).forEach(
      "tp_kv_assemble_grad", members * rows * 2 * piece,
      [=] PIPER_LAMBDA(int64_t e) {
        int64_t r = e / (2 * piece), col = e % (2 * piece);
        int64_t member = r / rows, i = r % rows;
        if (member / share != group) {
          dpieces[e] = 0.0f;
          return;
        }
        int64_t s = member - group * share, kv = col / piece,
                c = col % piece;
        dpieces[e] = dy[i * cols + query + kv * hd + s * piece + c];
      });
}

Status launchColumnSums(const Context &ctx, const float *x, int64_t rows,
                        int64_t cols, double *partials, float *out,
                        const uint16_t *x16) {
  const int64_t chunks = columnSumChunks(rows);
  PIPER_RETURN_IF_ERROR(Exec(ctx).forEach(
      "bias_grad_partials", chunks * cols, [=] PIPER_LAMBDA(int64_t i) {
        int64_t c = i / cols, j = i % cols;
        int64_t begin = c * kColumnChunkRows;
        int64_t end =
            begin + kColumnChunkRows < rows ? begin + kColumnChunkRows : rows;
        double s = 0;
        for (int64_t r = begin; r < end; ++r)
          s += x16 ? fromBf16(x16[r * cols + j]) : x[r * cols + j];
        partials[i] = s;
      }));
  return Exec(ctx).forEach("bias_grad", cols, [=] PIPER_LAMBDA(int64_t j) {
    double s = 0;
    for (int64_t c = 0; c < chunks; ++c)
      s += partials[c * cols + j];
    out[j] = static_cast<float>(s);
  });
}

Status launchCrossEntropy(const Context &ctx, const float *logits,
                          const int32_t *targets, const CrossEntropyDims &d,
                          double *rowLoss, float *loss, double rowScale,
                          float *dlogits, bool round, bool roundLoss,
                          uint16_t *dlogits16, const uint16_t *logits16) {
  const int64_t rows = d.rows, vocab = d.vocab, ld = d.ld, gradLd = d.gradLd;
  using Lanes = Exec::Lanes;
  // One warp per row: the log-sum-exp once, then the row's loss (rowLoss),
  // its gradient (dlogits, or packed dlogits16) or both (the fused
  // classifier), so that the fused outputs are bit for bit those of the
  // two kernels.
  const bool grad = dlogits || dlogits16;
  const char *name = !loss  ? "cross_entropy_grad"
                     : grad ? "cross_entropy_fused"
                            : "cross_entropy";
  PIPER_RETURN_IF_ERROR(Exec(ctx).forEachRow(
      name, rows, [=] PIPER_LAMBDA(Lanes lanes, int64_t r) {
        // Element j of the row: fp32, or packed (the same value).
        const float *row = logits16 ? nullptr : logits + r * ld;
        const uint16_t *row16 = logits16 ? logits16 + r * ld : nullptr;
        auto at = [=](int64_t j) {
          return row16 ? fromBf16(row16[j]) : row[j];
        };
        SoftmaxSum s;
        for (int64_t j = lanes.lane(); j < vocab; j += Lanes::kCount)
          s.add(at(j));
        double lse = logSumExp(lanes, s);
        const int32_t t = targets[r];
        if (rowLoss && lanes.lane() == 0)
          rowLoss[r] = validTarget(t, vocab) ? lse - at(t) : lse;
        if (!grad)
          return;
        // As the CPU: the exponent is rounded to float once, from double;
        // the target's element in double, then rounded.
        const float scale = static_cast<float>(rowScale);
        for (int64_t j = lanes.lane(); j < vocab; j += Lanes::kCount) {
          float e = expF(static_cast<float>(double(at(j)) - lse));
          float g = j == t ? static_cast<float>(rowScale * (double(e) - 1.0))
                           : scale * e;
          storeRounded(dlogits, dlogits16, r * gradLd + j, g, round);
        }
      }));
  if (!loss)
    return Status::ok();
  return Exec(ctx).forEachRow(
      "cross_entropy_mean", 1, [=] PIPER_LAMBDA(Lanes lanes, int64_t) {
        double s = 0;
        for (int64_t r = lanes.lane(); r < rows; r += Lanes::kCount)
          s += rowLoss[r];
        s = lanes.sum(s);
        if (lanes.lane() == 0)
          *loss = roundedIf(static_cast<float>(s / rows), roundLoss);
      });
}

Status launchVocabCeStats(const Context &ctx, const float *logits,
                          const int32_t *targets, int64_t rows, int64_t vocab,
                          int64_t members, int64_t member, float *stats) {
  using Lanes = Exec::Lanes;
  const int64_t width = 4 * members + 1, first = member * vocab;
  return Exec(ctx).forEachRow(
      "vocab_ce_stats", rows, [=] PIPER_LAMBDA(Lanes lanes, int64_t r) {
        const float *row = logits + r * vocab;
        SoftmaxSum s;
        for (int64_t j = lanes.lane(); j < vocab; j += Lanes::kCount)
          s.add(row[j]);
        float rowMax = lanes.max(s.max);
        double scaled =
            s.sum == 0 ? 0.0 : s.sum * exp(double(s.max) - double(rowMax));
        // The sum as hi + mid + lo, hi and mid bf16 values (as the CPU).
        float sum = static_cast<float>(lanes.sum(scaled));
        float hi = fromBf16(toBf16(sum));
        float mid = fromBf16(toBf16(sum - hi));
        float lo = (sum - hi) - mid;
        const int64_t t = int64_t(targets[r]) - first;
        // Each lane writes its own columns: no lane reads another's.
        for (int64_t j = lanes.lane(); j < width; j += Lanes::kCount) {
          float v = 0.0f;
          if (j == member)
            v = rowMax;
          else if (j == members + member)
            v = hi;
          else if (j == 2 * members + member)
            v = mid;
          else if (j == 3 * members + member)
            v = lo;
          else if (j == 4 * members && t >= 0 && t < vocab)
            v = row[t];
          stats[r * width + j] = v;
        }
      });
}

Status launchVocabCrossEntropy(const Context &ctx, const float *stats,
                               int64_t rows, int64_t members, double *rowLoss,
                               float *loss) {
  using Lanes = Exec::Lanes;
  const int64_t width = 4 * members + 1;
  PIPER_RETURN_IF_ERROR(Exec(ctx).forEach(
      "vocab_cross_entropy", rows, [=] PIPER_LAMBDA(int64_t r) {
        const float *row = stats + r * width;
        rowLoss[r] = statsLogSumExp(row, members) - row[4 * members];
      }));
  return Exec(ctx).forEachRow(
      "vocab_cross_entropy_mean", 1, [=] PIPER_LAMBDA(Lanes lanes, int64_t) {
        double s = 0;
        for (int64_t r = lanes.lane(); r < rows; r += Lanes::kCount)
          s += rowLoss[r];
        s = lanes.sum(s);
        if (lanes.lane() == 0)
          *loss = static_cast<float>(s / rows);
      });
}

Status launchVocabCrossEntropyGrad(const Context &ctx, const float *stats,
                                   const float *logits,
                                   const int32_t *targets, int64_t rows,
                                   int64_t vocab, int64_t members,
                                   int64_t member, double rowScale,
                                   float *dlogits) {
  using Lanes = Exec::Lanes;
  const int64_t width = 4 * members + 1, first = member * vocab;
  return Exec(ctx).forEachRow(
      "vocab_cross_entropy_grad", rows,
      [=] PIPER_LAMBDA(Lanes lanes, int64_t r) {
        const float *row = logits + r * vocab;
        float *out = dlogits + r * vocab;
        double lse = statsLogSumExp(stats + r * width, members);
        const float scale = static_cast<float>(rowScale);
        const int64_t t = int64_t(targets[r]) - first;
        for (int64_t j = lanes.lane(); j < vocab; j += Lanes::kCount) {
          float e = expF(static_cast<float>(double(row[j]) - lse));
          out[j] = j == t ? static_cast<float>(rowScale * (double(e) - 1.0))
                          : scale * e;
        }
      });
}

Status launchAccumulateLoss(const Context &ctx, const float *value,
                            double scale, double *acc) {
  return Exec(ctx).forEach("loss_accumulate", 1, [=] PIPER_LAMBDA(int64_t) {
    *acc = addScaled(*acc, scale, *value);
  });
}

} // namespace piper::runtime::hal::PIPER_GPU_NS
