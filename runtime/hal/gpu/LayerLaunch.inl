// The layer launchers' bodies, written once: included by Layer.cu (Exec =
// CudaExec) and LayerHost.cpp (Exec = HostExec), after `Exec` is declared in
// this namespace. Norms run a warp per row; column sums (norm weight
// gradients, the position gradient) run one thread per (chunk of rows,
// column) into double partials, then one thread per column adds the
// partials in chunk order: deterministic, no atomics.

namespace piper::runtime::hal::PIPER_GPU_NS {

// out[j] = the sum over c < chunks of partials[c * cols + j], in order,
// rounded with `to.round`, and with `to.accumulate` added to out[j].
// (Not in an unnamed namespace: nvcc's extended lambdas need an enclosing
// function with external linkage.)
Status layerSumChunks(const Context &ctx, const char *name,
                      const double *partials, int64_t chunks, int64_t cols,
                      float *out, SumsOut to = {}) {
  return Exec(ctx).forEach(name, cols, [=] PIPER_LAMBDA(int64_t j) {
    double s = 0;
    for (int64_t c = 0; c < chunks; ++c)
      s += partials[c * cols + j];
    const float v = roundedIf(static_cast<float>(s), to.round);
    out[j] = to.accumulate ? out[j] + v : v;
  });
}

Status launchEmbedding(const Context &ctx, const int32_t *ids,
                       const float *table, float *y, int64_t rows,
                       int64_t vocab, int64_t hidden, int64_t first, bool round,
                       uint16_t *y16) {
  return Exec(ctx).forEach(
      "embedding", rows * hidden, [=] PIPER_LAMBDA(int64_t i) {
        int64_t n = i / hidden, j = i % hidden;
        int64_t id = ids[n] - first;
        storeRounded(y, y16, i,
                     id >= 0 && id < vocab ? table[id * hidden + j] : 0.0f,
                     round);
      });
}

Status launchEmbeddingGrad(const Context &ctx, const int32_t *ids,
                           const float *dy, float *dtable, int64_t rows,
                           int64_t vocab, int64_t hidden, int64_t first,
                           int32_t *scratch, const uint16_t *dy16, SumsOut to) {
  using Lanes = Exec::Lanes;
  // A stable counting sort of the rows by id (LayerMath.h's sortChunks):
  // hist[c * vocab + v] counts the rows of chunk c with id v, then becomes
  // their offset within bucket v; start[v] is bucket v's first slot in
  // `order`, start[vocab] the number of valid rows; tileStart[t] the first
  // slot of the ids [t kScanTile, (t + 1) kScanTile).
  const RowChunks rc = sortChunks(rows, vocab);
  const int64_t chunks = rc.chunks, per = rc.rowsPerChunk;
  int32_t *hist = scratch;
  int32_t *start = hist + chunks * vocab;
  int32_t *order = start + vocab + 1;
  int32_t *tileStart = order + rows;
  PIPER_RETURN_IF_ERROR(zeroAsync(
      ctx, hist, static_cast<size_t>(chunks * vocab) * sizeof(int32_t)));
  PIPER_RETURN_IF_ERROR(
      Exec(ctx).forEach("embedding_grad", chunks, [=] PIPER_LAMBDA(int64_t c) {
        int64_t end = (c + 1) * per < rows ? (c + 1) * per : rows;
        for (int64_t n = c * per; n < end; ++n) {
          int64_t id = ids[n] - first;
          if (id >= 0 && id < vocab)
            ++hist[c * vocab + id];
        }
      }));
  // Per id: the chunks' counts become offsets; start[v] = the bucket's size.
  PIPER_RETURN_IF_ERROR(
      Exec(ctx).forEach("embedding_grad", vocab, [=] PIPER_LAMBDA(int64_t v) {
        int32_t running = 0;
        for (int64_t c = 0; c < chunks; ++c) {
          int32_t count = hist[c * vocab + v];
          hist[c * vocab + v] = running;
          running += count;
        }
        start[v] = running;
      }));
  // Exclusive scan of the sizes: a warp per tile of kScanTile ids, then one
  // warp over the tiles' totals, then each id adds its tile's offset.
  const int64_t tiles = (vocab + kScanTile - 1) / kScanTile;
  PIPER_RETURN_IF_ERROR(Exec(ctx).forEachRow(
      "embedding_grad", tiles, [=] PIPER_LAMBDA(Lanes lanes, int64_t t) {
        int64_t begin = t * kScanTile;
        int64_t count = vocab - begin < kScanTile ? vocab - begin : kScanTile;
        int64_t total = exclusiveScan(lanes, start + begin, count);
        if (lanes.lane() == 0)
          tileStart[t] = static_cast<int32_t>(total);
      }));
  PIPER_RETURN_IF_ERROR(Exec(ctx).forEachRow(
      "embedding_grad", 1, [=] PIPER_LAMBDA(Lanes lanes, int64_t) {
        int64_t total = exclusiveScan(lanes, tileStart, tiles);
        if (lanes.lane() == 0)
          start[vocab] = static_cast<int32_t>(total);
      }));
  PIPER_RETURN_IF_ERROR(
      Exec(ctx).forEach("embedding_grad", vocab, [=] PIPER_LAMBDA(int64_t v) {
        start[v] += tileStart[v / kScanTile];
      }));
  // Scatter: chunk c's rows in token order after the earlier chunks' rows.
  PIPER_RETURN_IF_ERROR(
      Exec(ctx).forEach("embedding_grad", chunks, [=] PIPER_LAMBDA(int64_t c) {
        int64_t end = (c + 1) * per < rows ? (c + 1) * per : rows;
        for (int64_t n = c * per; n < end; ++n) {
          int64_t id = ids[n] - first;
          if (id >= 0 && id < vocab)
            order[start[id] + hist[c * vocab + id]++] = static_cast<int32_t>(n);
        }
      }));
  // Every element of dtable: its bucket's rows of dy, in token order.
  return Exec(ctx).forEach(
      "embedding_grad", vocab * hidden, [=] PIPER_LAMBDA(int64_t i) {
        int64_t v = i / hidden, j = i % hidden;
        double s = 0;
        const RowIn in{dy, dy16};
        for (int64_t k = start[v], e = start[v + 1]; k < e; ++k)
          s += in[int64_t(order[k]) * hidden + j];
        const float g = roundedIf(static_cast<float>(s), to.round);
        dtable[i] = to.accumulate ? dtable[i] + g : g;
      });
}

Status launchPositionAdd(const Context &ctx, const float *x, const float *pos,
                         float *y, int64_t rows, int64_t hidden,
                         PositionMap map, bool round, const uint16_t *x16,
                         uint16_t *y16) {
  return Exec(ctx).forEach(
      "position_add", rows * hidden, [=] PIPER_LAMBDA(int64_t i) {
        int64_t n = i / hidden, j = i % hidden;
        storeRounded(y, y16, i,
                     RowIn{x, x16}[i] +
                         pos[map.position(n % map.local) * hidden + j],
                     round);
      });
}

Status launchPositionAddGrad(const Context &ctx, const float *dy, float *dpos,
                             int64_t rows, int64_t hidden, PositionMap map,
                             int64_t positions, double *partials,
                             const uint16_t *dy16, SumsOut to) {
  // dy as [rows / local, local * hidden]: the position of local row t
  // gets column sums t * hidden .. (t + 1) * hidden.
  const int64_t seq = map.local;
  const int64_t batch = rows / seq, cols = seq * hidden;
  const RowChunks rc = columnChunks(batch);
  const int64_t per = rc.rowsPerChunk;
  PIPER_RETURN_IF_ERROR(Exec(ctx).forEach(
      "position_add_grad", rc.chunks * cols, [=] PIPER_LAMBDA(int64_t i) {
        int64_t c = i / cols, col = i % cols;
        int64_t end = (c + 1) * per < batch ? (c + 1) * per : batch;
        double s = 0;
        for (int64_t b = c * per; b < end; ++b)
          s += RowIn{dy, dy16}[b * cols + col];
        partials[i] = s;
      }));
  // The rows [from, positions) get no gradient here but are part of the
  // parameter: zeros, or +0 added to the accumulator.
  auto noGradient = [&](int64_t from) -> Status {
    if (from >= positions)
      return Status::ok();
    float *rest = dpos + from * hidden;
    if (!to.accumulate)
      return zeroAsync(ctx, rest,
                       static_cast<size_t>((positions - from) * hidden) *
                           sizeof(float));
    return Exec(ctx).forEach(
        "position_add_grad", (positions - from) * hidden,
        [=] PIPER_LAMBDA(int64_t i) { rest[i] = rest[i] + 0.0f; });
  };
  if (map.cp == 1) {
    PIPER_RETURN_IF_ERROR(layerSumChunks(ctx, "position_add_grad", partials,
                                         rc.chunks, cols, dpos, to));
    // Positions past seq.
    return noGradient(seq);
  }
  // Context parallelism: this member's two chunks of positions; the
  // others' (and those past seq) get no gradient here. Every row first
  // (acc + 0 then + g is acc + g: g, a sum from +0, is never -0).
  PIPER_RETURN_IF_ERROR(noGradient(0));
  const int64_t chunks = rc.chunks;
  return Exec(ctx).forEach(
      "position_add_grad", cols, [=] PIPER_LAMBDA(int64_t col) {
        double s = 0;
        for (int64_t c = 0; c < chunks; ++c)
          s += partials[c * cols + col];
        int64_t t = col / hidden, j = col % hidden;
        float *out = dpos + map.position(t) * hidden + j;
        const float g = roundedIf(static_cast<float>(s), to.round);
        *out = to.accumulate ? *out + g : g;
      });
}

// The norm's input row n: x's (fp32 or packed), or with `residual` s = x +
// r, stored (rounded with `round`; or packed, rounded) by this row's lanes,
// each reading back only its own elements (the loops below stride as this
// one): a packed s reads back as the rounded value an fp32 s holds.
PIPER_HOST_DEVICE inline RowIn residualRow(Exec::Lanes lanes, const float *x,
                                           const uint16_t *x16,
                                           ResidualSum residual, int64_t n,
                                           int64_t hidden, bool round) {
  const RowIn xr{x, x16, n * hidden};
  if (!residual.r && !residual.r16)
    return xr;
  const RowIn rr{residual.r, residual.r16, n * hidden};
  for (int64_t j = lanes.lane(); j < hidden; j += Exec::Lanes::kCount)
    storeRounded(residual.sum, residual.sum16, n * hidden + j, xr[j] + rr[j],
                 round);
  return RowIn{residual.sum, residual.sum16, n * hidden};
}

// dx[j] = v, or with `residual` residual[j] + v rounded as grad_input's
// output first (the fused *_grad_input_add).
PIPER_HOST_DEVICE inline float withResidual(float v, const RowIn &residual,
                                            int64_t i, bool round) {
  v = roundedIf(v, round);
  return residual.f32 || residual.bf16 ? roundedIf(v + residual[i], round) : v;
}

Status launchLayerNorm(const Context &ctx, const float *x, const float *gamma,
                       const float *beta, float *y, int64_t rows,
                       int64_t hidden, double eps, bool round,
                       ResidualSum residual, uint16_t *y16,
                       const uint16_t *x16) {
  using Lanes = Exec::Lanes;
  return Exec(ctx).forEachRow(
      "layer_norm", rows, [=] PIPER_LAMBDA(Lanes lanes, int64_t n) {
        const RowIn xr = residualRow(lanes, x, x16, residual, n, hidden, round);
        double mean = 0, rstd = 0;
        layerNormStats(lanes, xr, hidden, eps, mean, rstd);
        for (int64_t j = lanes.lane(); j < hidden; j += Lanes::kCount) {
          float v =
              static_cast<float>((xr[j] - mean) * rstd * gamma[j] + beta[j]);
          storeRounded(y, y16, n * hidden + j, v, round);
        }
      });
}

Status launchLayerNormGradInput(const Context &ctx, const float *x,
                                const float *gamma, const float *dy, float *dx,
                                int64_t rows, int64_t hidden, double eps,
                                bool round, const float *residual,
                                NormPacked packed) {
  using Lanes = Exec::Lanes;
  return Exec(ctx).forEachRow(
      "layer_norm_grad_input", rows, [=] PIPER_LAMBDA(Lanes lanes, int64_t n) {
        const RowIn xr{x, packed.x, n * hidden};
        const RowIn dyr{dy, packed.dy, n * hidden};
        float *dxr = dx ? dx + n * hidden : nullptr;
        uint16_t *dxr16 = packed.dx ? packed.dx + n * hidden : nullptr;
        const RowIn sum{residual, packed.residual};
        double mean = 0, rstd = 0;
        layerNormStats(lanes, xr, hidden, eps, mean, rstd);
        // dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy * gamma.
        double gSum = 0, gxSum = 0;
        for (int64_t j = lanes.lane(); j < hidden; j += Lanes::kCount) {
          double g = double(dyr[j]) * gamma[j];
          gSum += g;
          gxSum += g * ((xr[j] - mean) * rstd);
        }
        gSum = lanes.sum(gSum);
        gxSum = lanes.sum(gxSum);
        const double gMean = gSum / hidden, gxMean = gxSum / hidden;
        for (int64_t j = lanes.lane(); j < hidden; j += Lanes::kCount) {
          double g = double(dyr[j]) * gamma[j];
          double xhat = (xr[j] - mean) * rstd;
          storeRounded(dxr, dxr16, j,
                       withResidual(static_cast<float>(
                                        rstd * (g - gMean - xhat * gxMean)),
                                    sum, n * hidden + j, round),
                       false);
        }
      });
}

Status launchLayerNormGradWeight(const Context &ctx, const float *x,
                                 const float *dy, float *dgamma, float *dbeta,
                                 int64_t rows, int64_t hidden, double eps,
                                 double *scratch, SumsOut to,
                                 NormPacked packed) {
  using Lanes = Exec::Lanes;
  const RowChunks rc = columnChunks(rows);
  const int64_t per = rc.rowsPerChunk;
  double *stats = scratch;               // [rows] of (mean, rstd)
  double *gammaParts = stats + 2 * rows; // [chunks, hidden]
  double *betaParts = gammaParts + rc.chunks * hidden;
  PIPER_RETURN_IF_ERROR(Exec(ctx).forEachRow(
      "layer_norm_grad_weight", rows, [=] PIPER_LAMBDA(Lanes lanes, int64_t n) {
        double mean = 0, rstd = 0;
        layerNormStats(lanes, RowIn{x, packed.x, n * hidden}, hidden, eps, mean,
                       rstd);
        if (lanes.lane() == 0) {
          stats[2 * n] = mean;
          stats[2 * n + 1] = rstd;
        }
      }));
  PIPER_RETURN_IF_ERROR(Exec(ctx).forEach(
      "layer_norm_grad_weight", rc.chunks * hidden,
      [=] PIPER_LAMBDA(int64_t i) {
        int64_t c = i / hidden, j = i % hidden;
        int64_t end = (c + 1) * per < rows ? (c + 1) * per : rows;
        double g = 0, b = 0;
        for (int64_t n = c * per; n < end; ++n) {
          float d = RowIn{dy, packed.dy, n * hidden}[j];
          double xhat = (RowIn{x, packed.x, n * hidden}[j] - stats[2 * n]) *
                        stats[2 * n + 1];
          g += d * xhat;
          b += d;
        }
        gammaParts[i] = g;
        betaParts[i] = b;
      }));
  PIPER_RETURN_IF_ERROR(layerSumChunks(ctx, "layer_norm_grad_weight",
                                       gammaParts, rc.chunks, hidden, dgamma,
                                       to));
  return layerSumChunks(ctx, "layer_norm_grad_weight", betaParts, rc.chunks,
                        hidden, dbeta, to);
}

Status launchRmsNorm(const Context &ctx, const float *x, const float *gamma,
                     float *y, int64_t rows, int64_t hidden, double eps,
                     bool round, ResidualSum residual, uint16_t *y16,
                     const uint16_t *x16) {
  using Lanes = Exec::Lanes;
  return Exec(ctx).forEachRow(
      "rms_norm", rows, [=] PIPER_LAMBDA(Lanes lanes, int64_t n) {
        const RowIn xr = residualRow(lanes, x, x16, residual, n, hidden, round);
        double rrms = rmsNormRrms(lanes, xr, hidden, eps);
        for (int64_t j = lanes.lane(); j < hidden; j += Lanes::kCount) {
          storeRounded(y, y16, n * hidden + j,
                       static_cast<float>(xr[j] * rrms * gamma[j]), round);
        }
      });
}

Status launchRmsNormGradInput(const Context &ctx, const float *x,
                              const float *gamma, const float *dy, float *dx,
                              int64_t rows, int64_t hidden, double eps,
                              bool round, const float *residual,
                              NormPacked packed) {
  using Lanes = Exec::Lanes;
  return Exec(ctx).forEachRow(
      "rms_norm_grad_input", rows, [=] PIPER_LAMBDA(Lanes lanes, int64_t n) {
        const RowIn xr{x, packed.x, n * hidden};
        const RowIn dyr{dy, packed.dy, n * hidden};
        float *dxr = dx ? dx + n * hidden : nullptr;
        uint16_t *dxr16 = packed.dx ? packed.dx + n * hidden : nullptr;
        const RowIn sum{residual, packed.residual};
        double rrms = rmsNormRrms(lanes, xr, hidden, eps);
        // dx = rrms * (g - xhat * mean(g * xhat)), g = dy * gamma,
        // xhat = x * rrms.
        double acc = 0;
        for (int64_t j = lanes.lane(); j < hidden; j += Lanes::kCount)
          acc += double(dyr[j]) * gamma[j] * (xr[j] * rrms);
        const double gxMean = lanes.sum(acc) / hidden;
        for (int64_t j = lanes.lane(); j < hidden; j += Lanes::kCount) {
          double g = double(dyr[j]) * gamma[j];
          storeRounded(dxr, dxr16, j,
                       withResidual(static_cast<float>(
                                        rrms * (g - xr[j] * rrms * gxMean)),
                                    sum, n * hidden + j, round),
                       false);
        }
      });
}

Status launchRmsNormGradWeight(const Context &ctx, const float *x,
                               const float *dy, float *dgamma, int64_t rows,
                               int64_t hidden, double eps, double *scratch,
                               SumsOut to, NormPacked packed) {
  using Lanes = Exec::Lanes;
  const RowChunks rc = columnChunks(rows);
  const int64_t per = rc.rowsPerChunk;
  double *rrmsOf = scratch;      // [rows]
  double *parts = rrmsOf + rows; // [chunks, hidden]
  PIPER_RETURN_IF_ERROR(Exec(ctx).forEachRow(
      "rms_norm_grad_weight", rows, [=] PIPER_LAMBDA(Lanes lanes, int64_t n) {
        double rrms =
            rmsNormRrms(lanes, RowIn{x, packed.x, n * hidden}, hidden, eps);
        if (lanes.lane() == 0)
          rrmsOf[n] = rrms;
      }));
  PIPER_RETURN_IF_ERROR(Exec(ctx).forEach(
      "rms_norm_grad_weight", rc.chunks * hidden, [=] PIPER_LAMBDA(int64_t i) {
        int64_t c = i / hidden, j = i % hidden;
        int64_t end = (c + 1) * per < rows ? (c + 1) * per : rows;
        double g = 0;
        for (int64_t n = c * per; n < end; ++n) {
          double xhat = RowIn{x, packed.x, n * hidden}[j] * rrmsOf[n];
          g += RowIn{dy, packed.dy, n * hidden}[j] * xhat;
        }
        parts[i] = g;
      }));
  return layerSumChunks(ctx, "rms_norm_grad_weight", parts, rc.chunks, hidden,
                        dgamma, to);
}

// qk_norm: virtual rows of hd, r = n (heads + 2 kvHeads) + head; a head
// of q reads gamma[0, hd), of k gamma[hd, 2 hd), of v none (copied).
Status launchQkNorm(const Context &ctx, const float *x, const float *gamma,
                    float *y, int64_t rows, int64_t heads, int64_t kvHeads,
                    int64_t hd, double eps) {
  using Lanes = Exec::Lanes;
  const int64_t g = heads + 2 * kvHeads;
  return Exec(ctx).forEachRow(
      "qk_norm", rows * g, [=] PIPER_LAMBDA(Lanes lanes, int64_t r) {
        const float *xr = x + r * hd;
        float *yr = y + r * hd;
        const int64_t j = r % g;
        if (j >= heads + kvHeads) {
          for (int64_t t = lanes.lane(); t < hd; t += Lanes::kCount)
            yr[t] = xr[t];
          return;
        }
        const float *gm = gamma + (j < heads ? 0 : hd);
        double rrms = rmsNormRrms(lanes, xr, hd, eps);
        for (int64_t t = lanes.lane(); t < hd; t += Lanes::kCount)
          yr[t] = static_cast<float>(xr[t] * rrms * gm[t]);
      });
}

Status launchQkNormGradInput(const Context &ctx, const float *x,
                             const float *gamma, const float *dy, float *dx,
                             int64_t rows, int64_t heads, int64_t kvHeads,
                             int64_t hd, double eps) {
  using Lanes = Exec::Lanes;
  const int64_t g = heads + 2 * kvHeads;
  return Exec(ctx).forEachRow(
      "qk_norm_grad_input", rows * g, [=] PIPER_LAMBDA(Lanes lanes, int64_t r) {
        const float *xr = x + r * hd, *dyr = dy + r * hd;
        float *dxr = dx + r * hd;
        const int64_t j = r % g;
        if (j >= heads + kvHeads) {
          for (int64_t t = lanes.lane(); t < hd; t += Lanes::kCount)
            dxr[t] = dyr[t];
          return;
        }
        const float *gm = gamma + (j < heads ? 0 : hd);
        double rrms = rmsNormRrms(lanes, xr, hd, eps);
        // As rms_norm_grad_input: dx = rrms * (g - xhat * mean(g * xhat)).
        double acc = 0;
        for (int64_t t = lanes.lane(); t < hd; t += Lanes::kCount)
          acc += double(dyr[t]) * gm[t] * (xr[t] * rrms);
        const double gxMean = lanes.sum(acc) / hd;
        for (int64_t t = lanes.lane(); t < hd; t += Lanes::kCount) {
          double gv = double(dyr[t]) * gm[t];
          dxr[t] = static_cast<float>(rrms * (gv - xr[t] * rrms * gxMean));
        }
      });
}

Status launchQkNormGradWeight(const Context &ctx, const float *x,
                              const float *dy, float *dgamma, int64_t rows,
                              int64_t heads, int64_t kvHeads, int64_t hd,
                              double eps, double *scratch) {
  using Lanes = Exec::Lanes;
  const int64_t g = heads + 2 * kvHeads, cols = 2 * hd;
  const RowChunks rc = columnChunks(rows);
  const int64_t per = rc.rowsPerChunk;
  double *rrmsOf = scratch;          // [rows * g]
  double *parts = rrmsOf + rows * g; // [chunks, 2 hd]
  PIPER_RETURN_IF_ERROR(Exec(ctx).forEachRow(
      "qk_norm_grad_weight", rows * g,
      [=] PIPER_LAMBDA(Lanes lanes, int64_t r) {
        double rrms = rmsNormRrms(lanes, x + r * hd, hd, eps);
        if (lanes.lane() == 0)
          rrmsOf[r] = rrms;
      }));
  PIPER_RETURN_IF_ERROR(Exec(ctx).forEach(
      "qk_norm_grad_weight", rc.chunks * cols, [=] PIPER_LAMBDA(int64_t i) {
        int64_t c = i / cols, col = i % cols;
        int64_t t = col % hd;
        // Class 0: the q heads [0, heads); 1: the k heads.
        int64_t first = col < hd ? 0 : heads;
        int64_t last = col < hd ? heads : heads + kvHeads;
        int64_t end = (c + 1) * per < rows ? (c + 1) * per : rows;
        double acc = 0;
        for (int64_t n = c * per; n < end; ++n)
          for (int64_t j = first; j < last; ++j) {
            int64_t r = n * g + j;
            acc += dy[r * hd + t] * (x[r * hd + t] * rrmsOf[r]);
          }
        parts[i] = acc;
      }));
  return layerSumChunks(ctx, "qk_norm_grad_weight", parts, rc.chunks, cols,
                        dgamma);
}

static Status fillUlyssesCounts(const Context &ctx, int32_t *counts,
                               int64_t cp, int64_t each) {
  return Exec(ctx).forEach("cp_ulysses_counts", cp, [=] PIPER_LAMBDA(int64_t j) {
    counts[j] = static_cast<int32_t>(each);
  });
}

Status launchUlyssesColumns(const Context &ctx, const float *x,
                            UlyssesColumns c, int64_t rows, bool merge,
                            float *y, int32_t *counts) {
  const int64_t wide = c.wide(), narrow = c.narrow();
  if (merge)
    return Exec(ctx).forEach(
        "cp_ulysses_merge", rows * wide, [=] PIPER_LAMBDA(int64_t e) {
          int64_t r = e / wide, j = 0, col = 0;
          c.narrowColumn(e % wide, j, col);
          y[e] = x[(j * rows + r) * narrow + col];
        });
  PIPER_RETURN_IF_ERROR(Exec(ctx).forEach(
      "cp_ulysses_split", c.cp * rows * narrow, [=] PIPER_LAMBDA(int64_t e) {
        int64_t row = e / narrow, j = row / rows, r = row % rows;
        y[e] = x[r * wide + c.wideColumn(j, e % narrow)];
      }));
  return fillUlyssesCounts(ctx, counts, c.cp, rows);
}

Status launchUlyssesRows(const Context &ctx, const float *x, UlyssesRows r,
                         int64_t cols, bool zigzag, float *y,
                         int32_t *counts) {
  if (!zigzag)
    return Exec(ctx).forEach(
        "cp_ulysses_natural", r.rows * cols, [=] PIPER_LAMBDA(int64_t e) {
          y[e] = x[r.memberRow(e / cols) * cols + e % cols];
        });
  PIPER_RETURN_IF_ERROR(Exec(ctx).forEach(
      "cp_ulysses_zigzag", r.rows * cols, [=] PIPER_LAMBDA(int64_t e) {
        y[e] = x[r.naturalRow(e / cols) * cols + e % cols];
      }));
  return fillUlyssesCounts(ctx, counts, r.cp, r.rows / r.cp);
}

Status launchCpSplit(const Context &ctx, const float *x, UlyssesRows r,
                     int64_t cols, int64_t member, bool grad, float *y) {
  const int64_t n = r.rows / r.cp;
  if (!grad)
    return Exec(ctx).forEach(
        "cp_split", n * cols, [=] PIPER_LAMBDA(int64_t e) {
          y[e] = x[r.naturalRow(member * n + e / cols) * cols + e % cols];
        });
  return Exec(ctx).forEach(
      "cp_split_grad", r.rows * cols, [=] PIPER_LAMBDA(int64_t e) {
        int64_t at = r.memberRow(e / cols);
        y[e] = at / n == member ? x[(at % n) * cols + e % cols] : 0.0f;
      });
}

} // namespace piper::runtime::hal::PIPER_GPU_NS
