// The moe launchers' bodies, written once: included by Moe.cu (Exec =
// CudaExec) and MoeHost.cpp (Exec = HostExec), after `Exec` is declared in
// this namespace. Each follows its CPU kernel (runtime/kernels/
// MoeKernels.cpp, MoeEpKernels.cpp): the same double accumulations, in the
// same order where the order is per element; warp reductions (a fixed order)
// where the CPU sums a row sequentially.

namespace piper::runtime::hal::PIPER_GPU_NS {

// ---------------------------------------------------------------------------
// The router: a warp per token.

Status launchMoeRouter(const Context &ctx, const float *logits,
                       int32_t *indices, float *weights, int64_t rows,
                       int64_t experts, int64_t topK, bool normTopK) {
  using Lanes = Exec::Lanes;
  return Exec(ctx).forEachRow(
      "moe_router", rows, [=] PIPER_LAMBDA(Lanes lanes, int64_t n) {
        const float *row = logits + n * experts;
        float rowMax = -INFINITY;
        for (int64_t e = lanes.lane(); e < experts; e += Lanes::kCount)
          rowMax = fmaxf(rowMax, row[e]);
        rowMax = lanes.max(rowMax);
        double sum = 0;
        for (int64_t e = lanes.lane(); e < experts; e += Lanes::kCount)
          sum += exp(double(row[e]) - rowMax);
        sum = lanes.sum(sum);
        // Round j picks the first expert in the router's order (routerKey)
        // after round j - 1's pick: the top k in order, no marks needed.
        double prevKey = 2.0;
        int prevIndex = -1;
        for (int64_t j = 0; j < topK; ++j) {
          double bestKey = -2.0;
          int best = 0x7fffffff;
          for (int64_t e = lanes.lane(); e < experts; e += Lanes::kCount) {
            double key = routerKey(softmaxTerm(row[e], rowMax, sum));
            int ie = static_cast<int>(e);
            if (routerBefore(prevKey, prevIndex, key, ie) &&
                routerBefore(key, ie, bestKey, best)) {
              bestKey = key;
              best = ie;
            }
          }
          laneRouterFirst(lanes, bestKey, best);
          if (lanes.lane() == 0)
            indices[n * topK + j] = best;
          prevKey = bestKey;
          prevIndex = best;
        }
        if (lanes.lane() == 0) {
          // The weights as the CPU kernel: p of the picks, over their sum
          // (summed in pick order) with norm_topk.
          const int32_t *top = indices + n * topK;
          double norm = 0;
          for (int64_t j = 0; j < topK; ++j)
            norm += softmaxTerm(row[top[j]], rowMax, sum);
          if (!normTopK)
            norm = 1.0;
          for (int64_t j = 0; j < topK; ++j)
            weights[n * topK + j] = static_cast<float>(
                softmaxTerm(row[top[j]], rowMax, sum) / norm);
        }
      });
}

Status launchMoeRouterGrad(const Context &ctx, const float *logits,
                           const int32_t *indices, const float *dweights,
                           float *dlogits, int64_t rows, int64_t experts,
                           int64_t topK, bool normTopK) {
  using Lanes = Exec::Lanes;
  return Exec(ctx).forEachRow(
      "moe_router_grad", rows, [=] PIPER_LAMBDA(Lanes lanes, int64_t n) {
        const float *row = logits + n * experts;
        const int32_t *idx = indices + n * topK;
        const float *dw = dweights + n * topK;
        float *out = dlogits + n * experts;
        if (normTopK) {
          // w_j = softmax of the selected logits alone (shifted by their
          // maximum): dlogits[i_j] += w_j (dw_j - sum_j' dw_j' w_j').
          float selMax = -INFINITY;
          for (int64_t j = lanes.lane(); j < topK; j += Lanes::kCount)
            if (idx[j] >= 0 && idx[j] < experts)
              selMax = fmaxf(selMax, row[idx[j]]);
          selMax = lanes.max(selMax);
          double sum = 0;
          for (int64_t j = lanes.lane(); j < topK; j += Lanes::kCount)
            if (idx[j] >= 0 && idx[j] < experts)
              sum += exp(double(row[idx[j]]) - selMax);
          sum = lanes.sum(sum);
          double dot = 0;
          for (int64_t j = lanes.lane(); j < topK; j += Lanes::kCount)
            if (idx[j] >= 0 && idx[j] < experts)
              dot += dw[j] * softmaxTerm(row[idx[j]], selMax, sum);
          dot = lanes.sum(dot);
          for (int64_t e = lanes.lane(); e < experts; e += Lanes::kCount) {
            double g = 0;
            for (int64_t j = 0; j < topK; ++j)
              if (idx[j] == e)
                g += softmaxTerm(row[e], selMax, sum) * (dw[j] - dot);
            out[e] = static_cast<float>(g);
          }
        } else {
          // w_j = p[i_j]: dlogits[e] = p[e] (g[e] - sum_j p[i_j] dw_j) with
          // g[e] = sum_{j: i_j = e} dw_j.
          float rowMax = -INFINITY;
          for (int64_t e = lanes.lane(); e < experts; e += Lanes::kCount)
            rowMax = fmaxf(rowMax, row[e]);
          rowMax = lanes.max(rowMax);
          double sum = 0;
          for (int64_t e = lanes.lane(); e < experts; e += Lanes::kCount)
            sum += exp(double(row[e]) - rowMax);
          sum = lanes.sum(sum);
          double dot = 0;
          for (int64_t j = lanes.lane(); j < topK; j += Lanes::kCount)
            if (idx[j] >= 0 && idx[j] < experts)
              dot += softmaxTerm(row[idx[j]], rowMax, sum) * dw[j];
          dot = lanes.sum(dot);
          for (int64_t e = lanes.lane(); e < experts; e += Lanes::kCount) {
            double g = 0;
            for (int64_t j = 0; j < topK; ++j)
              if (idx[j] == e)
                g += dw[j];
            out[e] = static_cast<float>(softmaxTerm(row[e], rowMax, sum) *
                                        (g - dot));
          }
        }
      });
}

// ---------------------------------------------------------------------------
// Slot assignment: a warp per chunk of kMoeSlotChunk assignments, walked in
// order 32 at a time; the lanes of one expert find their ranks with a match
// and a prefix count, and the lowest of them advances the expert's counter
// in `table`. Deterministic, O(N k + E chunks) work, no atomics.

Status launchMoeChunkCounts(const Context &ctx, const int32_t *ids,
                            int64_t count, int64_t experts, int64_t *table) {
  using Lanes = Exec::Lanes;
  const int64_t chunks = moeSlotChunks(count);
  return Exec(ctx).forEachRow(
      "moe_chunk_counts", chunks, [=] PIPER_LAMBDA(Lanes lanes, int64_t c) {
        for (int64_t at = 0; at < kMoeSlotChunk; at += Lanes::kCount) {
          int64_t i = c * kMoeSlotChunk + at + lanes.lane();
          int e = i < count ? ids[i] : -1;
          if (e < 0 || e >= experts)
            e = -1;
          uint32_t same = lanes.match(e);
          if (e >= 0 && (same & lanes.maskBelow()) == 0)
            table[e * chunks + c] += popCount(same);
          lanes.sync();
        }
      });
}

Status launchMoeChunkOffsets(const Context &ctx, int64_t *table,
                             int64_t count, int64_t experts, int64_t *totals) {
  using Lanes = Exec::Lanes;
  const int64_t chunks = moeSlotChunks(count);
  return Exec(ctx).forEachRow(
      "moe_chunk_offsets", experts, [=] PIPER_LAMBDA(Lanes lanes, int64_t e) {
        int64_t running = 0;
        int64_t *counts = table + e * chunks;
        for (int64_t at = 0; at < chunks; at += Lanes::kCount) {
          int64_t c = at + lanes.lane();
          int64_t v = c < chunks ? counts[c] : 0;
          int64_t inclusive = inclusiveScan(lanes, v);
          if (c < chunks)
            counts[c] = running + inclusive - v;
          running += lanes.sum(v);
        }
        if (totals && lanes.lane() == 0)
          totals[e] = running;
      });
}

Status launchMoeAssignSlots(const Context &ctx, const int32_t *ids,
                            int64_t count, int64_t experts, int64_t capacity,
                            int64_t *table, int64_t *slot) {
  using Lanes = Exec::Lanes;
  const int64_t chunks = moeSlotChunks(count);
  return Exec(ctx).forEachRow(
      "moe_assign_slots", chunks, [=] PIPER_LAMBDA(Lanes lanes, int64_t c) {
        for (int64_t at = 0; at < kMoeSlotChunk; at += Lanes::kCount) {
          int64_t i = c * kMoeSlotChunk + at + lanes.lane();
          int e = i < count ? ids[i] : -1;
          if (e < 0 || e >= experts)
            e = -1;
          uint32_t same = lanes.match(e);
          int64_t base = e >= 0 ? table[e * chunks + c] : 0;
          if (i < count) {
            int64_t s = base + popCount(same & lanes.maskBelow());
            slot[i] = e >= 0 && s < capacity ? e * capacity + s : -1;
          }
          lanes.sync();
          if (e >= 0 && (same & lanes.maskBelow()) == 0)
            table[e * chunks + c] = base + popCount(same);
          lanes.sync();
        }
      });
}

// ---------------------------------------------------------------------------
// Dispatch and combine: a thread per element.

Status launchMoeDispatch(const Context &ctx, RowIn x, const int64_t *slot,
                         float *buf, uint16_t *buf16, int64_t rows,
                         int64_t topK, int64_t hidden, bool round) {
  return Exec(ctx).forEach(
      "moe_dispatch", rows * topK * hidden, [=] PIPER_LAMBDA(int64_t i) {
        int64_t a = i / hidden, h = i % hidden;
        int64_t s = slot[a];
        if (s >= 0)
          storeRounded(buf, buf16, s * hidden + h, x[(a / topK) * hidden + h],
                       round);
      });
}

Status launchMoeDispatchGrad(const Context &ctx, RowIn dbuf,
                             const int64_t *slot, float *dx, uint16_t *dx16,
                             int64_t rows, int64_t topK, int64_t hidden,
                             bool round) {
  return Exec(ctx).forEach(
      "moe_dispatch_grad", rows * hidden, [=] PIPER_LAMBDA(int64_t i) {
        int64_t n = i / hidden, h = i % hidden;
        double sum = 0;
        for (int64_t j = 0; j < topK; ++j) {
          int64_t s = slot[n * topK + j];
          if (s >= 0)
            sum += dbuf[s * hidden + h];
        }
        storeRounded(dx, dx16, i, static_cast<float>(sum), round);
      });
}

Status launchMoeCombine(const Context &ctx, RowIn ebuf, const int64_t *slot,
                        const float *weights, float *y, uint16_t *y16,
                        int64_t rows, int64_t topK, int64_t hidden,
                        bool round) {
  return Exec(ctx).forEach(
      "moe_combine", rows * hidden, [=] PIPER_LAMBDA(int64_t i) {
        int64_t n = i / hidden, h = i % hidden;
        double sum = 0;
        for (int64_t j = 0; j < topK; ++j) {
          int64_t s = slot[n * topK + j];
          if (s >= 0)
            sum += double(weights[n * topK + j]) * ebuf[s * hidden + h];
        }
        storeRounded(y, y16, i, static_cast<float>(sum), round);
      });
}

Status launchMoeCombineGrad(const Context &ctx, RowIn ebuf, const int64_t *slot,
                            const float *weights, RowIn dy, float *debuf,
                            uint16_t *debuf16, float *dweights, int64_t rows,
                            int64_t topK, int64_t hidden, bool round) {
  using Lanes = Exec::Lanes;
  // Every slot holds at most one assignment: debuf needs no accumulation.
  Status scattered = Exec(ctx).forEach(
      "moe_combine_grad", rows * topK * hidden, [=] PIPER_LAMBDA(int64_t i) {
        int64_t a = i / hidden, h = i % hidden;
        int64_t s = slot[a];
        if (s >= 0)
          storeRounded(debuf, debuf16, s * hidden + h,
                       static_cast<float>(double(weights[a]) *
                                          dy[(a / topK) * hidden + h]),
                       round);
      });
  if (!scattered.isOk())
    return scattered;
  return Exec(ctx).forEachRow(
      "moe_combine_grad", rows * topK, [=] PIPER_LAMBDA(Lanes lanes,
                                                        int64_t a) {
        int64_t s = slot[a];
        double dot = 0;
        if (s >= 0) {
          const RowIn row{ebuf.f32, ebuf.bf16, ebuf.at + s * hidden},
              dyr{dy.f32, dy.bf16, dy.at + (a / topK) * hidden};
          for (int64_t h = lanes.lane(); h < hidden; h += Lanes::kCount)
            dot += double(row[h]) * dyr[h];
        }
        dot = lanes.sum(dot);
        if (lanes.lane() == 0)
          dweights[a] = roundedIf(static_cast<float>(dot), round);
      });
}

// ---------------------------------------------------------------------------
// The load-balancing loss: a warp per token, then one warp for the sum.

Status launchMoeFractions(const Context &ctx, const int64_t *totals,
                          double *fraction, int64_t experts, int64_t rows,
                          int64_t topK) {
  return Exec(ctx).forEach("moe_aux_loss", experts,
                           [=] PIPER_LAMBDA(int64_t e) {
                             fraction[e] = double(totals[e]) /
                                           (double(rows) * double(topK));
                           });
}

Status launchMoeAuxLoss(const Context &ctx, const float *logits,
                        const double *fraction, double *rowDots, float *loss,
                        int64_t rows, int64_t experts) {
  using Lanes = Exec::Lanes;
  PIPER_RETURN_IF_ERROR(Exec(ctx).forEachRow(
      "moe_aux_loss", rows, [=] PIPER_LAMBDA(Lanes lanes, int64_t n) {
        const float *row = logits + n * experts;
        float rowMax = -INFINITY;
        for (int64_t e = lanes.lane(); e < experts; e += Lanes::kCount)
          rowMax = fmaxf(rowMax, row[e]);
        rowMax = lanes.max(rowMax);
        double sum = 0;
        for (int64_t e = lanes.lane(); e < experts; e += Lanes::kCount)
          sum += exp(double(row[e]) - rowMax);
        sum = lanes.sum(sum);
        double dot = 0;
        for (int64_t e = lanes.lane(); e < experts; e += Lanes::kCount)
          dot += fraction[e] * softmaxTerm(row[e], rowMax, sum);
        dot = lanes.sum(dot);
        if (lanes.lane() == 0)
          rowDots[n] = dot;
      }));
  return Exec(ctx).forEachRow(
      "moe_aux_loss", 1, [=] PIPER_LAMBDA(Lanes lanes, int64_t) {
        double total = 0;
        for (int64_t n = lanes.lane(); n < rows; n += Lanes::kCount)
          total += rowDots[n];
        total = lanes.sum(total);
        if (lanes.lane() == 0)
          loss[0] = static_cast<float>(double(experts) * total / double(rows));
      });
}

Status launchMoeAuxLossGrad(const Context &ctx, const float *logits,
                            const double *fraction, float *dlogits,
                            int64_t rows, int64_t experts, double scale) {
  using Lanes = Exec::Lanes;
  const double rowScale = scale * double(experts) / double(rows);
  return Exec(ctx).forEachRow(
      "moe_aux_loss_grad", rows, [=] PIPER_LAMBDA(Lanes lanes, int64_t n) {
        const float *row = logits + n * experts;
        float rowMax = -INFINITY;
        for (int64_t e = lanes.lane(); e < experts; e += Lanes::kCount)
          rowMax = fmaxf(rowMax, row[e]);
        rowMax = lanes.max(rowMax);
        double sum = 0;
        for (int64_t e = lanes.lane(); e < experts; e += Lanes::kCount)
          sum += exp(double(row[e]) - rowMax);
        sum = lanes.sum(sum);
        double dot = 0;
        for (int64_t e = lanes.lane(); e < experts; e += Lanes::kCount)
          dot += fraction[e] * softmaxTerm(row[e], rowMax, sum);
        dot = lanes.sum(dot);
        float *out = dlogits + n * experts;
        for (int64_t e = lanes.lane(); e < experts; e += Lanes::kCount)
          out[e] = static_cast<float>(rowScale *
                                      softmaxTerm(row[e], rowMax, sum) *
                                      (fraction[e] - dot));
      });
}

// ---------------------------------------------------------------------------
// Expert parallelism.

Status launchMoeEpCounts(const Context &ctx, const int64_t *totals,
                         int32_t *sendCounts, int32_t *expertCounts,
                         int32_t *expertSendCounts, int64_t members,
                         int64_t local, int64_t capacity) {
  PIPER_RETURN_IF_ERROR(Exec(ctx).forEach(
      "moe_ep_counts", members * local, [=] PIPER_LAMBDA(int64_t e) {
        int64_t used = totals[e] < capacity ? totals[e] : capacity;
        expertCounts[e] = static_cast<int32_t>(used);
      }));
  return Exec(ctx).forEach(
      "moe_ep_counts", members, [=] PIPER_LAMBDA(int64_t j) {
        int64_t total = 0;
        for (int64_t e = j * local; e < (j + 1) * local; ++e)
          total += totals[e] < capacity ? totals[e] : capacity;
        sendCounts[j] = static_cast<int32_t>(total);
        expertSendCounts[j] = static_cast<int32_t>(local);
      });
}

/// counts[i] clamped to [0, capacity].
PIPER_HOST_DEVICE inline int64_t epCount(const int32_t *counts, int64_t i,
                                         int64_t capacity) {
  int64_t c = counts[i];
  return c < 0 ? 0 : c > capacity ? capacity : c;
}

Status launchMoeEpRunStarts(const Context &ctx, const int32_t *counts,
                            int64_t entries, int64_t capacity, int64_t *base) {
  using Lanes = Exec::Lanes;
  return Exec(ctx).forEachRow(
      "moe_ep_offsets", 1, [=] PIPER_LAMBDA(Lanes lanes, int64_t) {
        int64_t running = 0;
        for (int64_t at = 0; at < entries; at += Lanes::kCount) {
          int64_t i = at + lanes.lane();
          int64_t v = i < entries ? epCount(counts, i, capacity) : 0;
          int64_t inclusive = inclusiveScan(lanes, v);
          if (i < entries)
            base[i] = running + inclusive - v;
          running += lanes.sum(v);
        }
      });
}

Status launchMoeEpSlotStarts(const Context &ctx, const int32_t *counts,
                             int64_t members, int64_t local, int64_t capacity,
                             int64_t *base) {
  return Exec(ctx).forEach(
      "moe_ep_offsets", local, [=] PIPER_LAMBDA(int64_t l) {
        int64_t filled = l * members * capacity;
        for (int64_t src = 0; src < members; ++src) {
          base[src * local + l] = filled;
          filled += epCount(counts, src * local + l, capacity);
        }
      });
}

Status launchMoeEpMoveRows(const Context &ctx, const float *from, float *to,
                           const int32_t *counts, const int64_t *fromBase,
                           const int64_t *toBase, int64_t entries,
                           int64_t capacity, int64_t hidden) {
  return Exec(ctx).forEach(
      "moe_ep_move_rows", entries * capacity * hidden,
      [=] PIPER_LAMBDA(int64_t i) {
        int64_t entry = i / (capacity * hidden);
        int64_t t = (i / hidden) % capacity, h = i % hidden;
        if (t >= epCount(counts, entry, capacity))
          return;
        int64_t f = fromBase ? fromBase[entry] : entry * capacity;
        int64_t d = toBase ? toBase[entry] : entry * capacity;
        to[(d + t) * hidden + h] = from[(f + t) * hidden + h];
      });
}

} // namespace piper::runtime::hal::PIPER_GPU_NS
