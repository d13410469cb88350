// The attention launchers' bodies, written once: included by Attention.cu
// (Exec = CudaExec) and AttentionHost.cpp (Exec = HostExec), after `Exec`
// is declared in this namespace.
//
// Forward: one warp per (sequence, head, query i) runs attendRow over keys
// 0..i, a block of 32 at a time (lane j scores key base + j), and writes
// y's row. The op's only output is y, so the forward saves no log-sum-exp;
// the backward, without a [seq, seq] matrix, recomputes in a stats pass
// each query row's softmax (maximum m, 1 / denominator) and D = <dy, y>; then
// dS_ij = scale P_ij (<dy_i, v_j> - D_i) gives dQ per query row (warp per
// (sequence, head, i), keys j <= i) and dK, dV per key row (warp per (sequence,
// kv head, j), the group's query heads and queries i >= j), each row owned by
// one warp: no atomics. Every pass takes its keys (queries) in blocks of 32,
// one per lane, scored by blockDot; the accumulations then take them in order
// with a shuffle each; rows are read as float4 where every row is 16-byte
// aligned (attentionWidth), the body compiled for both widths (withWidth). With
// rotary embeddings, q and k are rotated into scratch first and dQ, dK rotated
// back in place.

namespace piper::runtime::hal::PIPER_GPU_NS {

// The helpers are not in an anonymous namespace: nvcc's extended lambdas
// need enclosing functions with external linkage.

// The rotary table: entry (t, i) holds the cos and sin of position t's
// angle for pair i (ropeAngle), [seq, hd/2] doubles each.
Status launchRopeTable(const Context &ctx, const AttentionShape &s,
                       double *cosT, double *sinT) {
  const int64_t half = s.half(), hd = s.headDim;
  const double theta = s.ropeTheta;
  const RopeScaling scaling = s.rope;
  return Exec(ctx).forEach("attention_rope_table", s.seq * half,
                           [=] PIPER_LAMBDA(int64_t idx) {
                             ropeAngle(theta, scaling, hd, idx / half,
                                       idx % half, cosT[idx], sinT[idx]);
                           });
}

// Where one call's q and k come from: qkv itself, or the rotated copy in
// scratch ([rows, qCols + kvCols], q | k).
struct AttentionQkSource {
  const float *q = nullptr;
  int64_t ld = 0;
};

// The rotary table and q, k rotated into scratch (q | k of every row), or
// qkv's own q and k without rotary embeddings.
Status attentionPrepareQk(const Context &ctx, const AttentionShape &s,
                          const float *qkv, char *scratch,
                          const AttentionScratch &layout,
                          AttentionQkSource &src) {
  if (!s.rotary()) {
    src.q = qkv;
    src.ld = s.cols;
    return Status::ok();
  }
  double *cosT = reinterpret_cast<double *>(scratch + layout.cosOffset);
  double *sinT = reinterpret_cast<double *>(scratch + layout.sinOffset);
  float *qk = reinterpret_cast<float *>(scratch + layout.qkOffset);
  const int64_t half = s.half(), hd = s.headDim;
  PIPER_RETURN_IF_ERROR(launchRopeTable(ctx, s, cosT, sinT));
  const int64_t ldQk = s.qCols + s.kvCols, cols = s.cols, seq = s.seq;
  const int64_t pairs = ldQk / 2; // per row: (heads + kvHeads) * hd / 2
  PIPER_RETURN_IF_ERROR(Exec(ctx).forEach(
      "attention_rope", s.rows() * pairs, [=] PIPER_LAMBDA(int64_t idx) {
        int64_t r = idx / pairs, p = idx % pairs;
        int64_t col = (p / half) * hd + p % half;
        int64_t e = (r % seq) * half + p % half;
        const float *in = qkv + r * cols + col;
        float *out = qk + r * ldQk + col;
        ropePair(in[0], in[half], cosT[e], sinT[e], false, out[0], out[half]);
      }));
  src.q = qk;
  src.ld = ldQk;
  return Status::ok();
}

// The (sequence b, query head h) view: q and k from `src`, v and dy from
// qkv and dy.
PIPER_HOST_DEVICE inline AttentionHead
attentionHeadView(const AttentionShape &s, AttentionQkSource src,
                  const float *qkv, const float *dy, int64_t b, int64_t h) {
  int64_t g = h / s.group(), hd = s.headDim;
  AttentionHead view;
  view.q = src.q + b * s.seq * src.ld + h * hd;
  view.k = src.q + s.qCols + b * s.seq * src.ld + g * hd;
  view.v = qkv + s.qCols + s.kvCols + b * s.seq * s.cols + g * hd;
  view.dy = dy ? dy + b * s.seq * s.qCols + h * hd : nullptr;
  view.ldq = view.ldk = src.ld;
  view.ldv = s.cols;
  view.lddy = s.qCols;
  return view;
}

Status launchAttention(const Context &ctx, const AttentionShape &s,
                       const float *qkv, float *y, float *lse, char *scratch) {
  using Lanes = Exec::Lanes;
  AttentionScratch layout = attentionScratch(s, false);
  AttentionQkSource src;
  PIPER_RETURN_IF_ERROR(attentionPrepareQk(ctx, s, qkv, scratch, layout, src));
  const int width = attentionWidth(s, src.q, qkv, nullptr);
  return Exec(ctx).forEachRow(
      "attention", s.batch * s.heads * s.seq,
      [=] PIPER_LAMBDA(Lanes lanes, int64_t r) {
        withWidth(width, [&](auto w) {
          constexpr int W = decltype(w)::value;
          constexpr int kPer = kMaxHeadDim / Lanes::kCount;
          int64_t i = r % s.seq, bh = r / s.seq;
          int64_t h = bh % s.heads, b = bh / s.heads;
          AttentionHead view = attentionHeadView(s, src, qkv, nullptr, b, h);
          float acc[kPer];
          float m, l;
          attendRow<W>(lanes, s, view, i, i, acc, m, l);
          storeLaneShare<W>(lanes, acc, 1.0f / l,
                            y + (b * s.seq + i) * s.qCols + h * s.headDim,
                            s.headDim);
          // The row's log-sum-exp (the backward's statistics), as the CPU
          // and the ring's blocks compute it.
          if (lanes.lane() == 0)
            storeRingLse(lse, s.heads, b * s.seq + i, h,
                         static_cast<float>(double(m) + log(double(l))));
        });
      });
}

Status launchAttentionGrad(const Context &ctx, const AttentionShape &s,
                           const float *qkv, const float *dy, float *dqkv,
                           char *scratch) {
  using Lanes = Exec::Lanes;
  AttentionScratch layout = attentionScratch(s, true);
  AttentionQkSource src;
  PIPER_RETURN_IF_ERROR(attentionPrepareQk(ctx, s, qkv, scratch, layout, src));
  // One width for every pass: their dots must agree bit for bit.
  const int width = attentionWidth(s, src.q, qkv, dy);
  const int64_t queryRows = s.batch * s.heads * s.seq;
  // Per (sequence, head, query), indexed like the query rows below.
  float *rowMax = reinterpret_cast<float *>(scratch + layout.statsOffset);
  float *rowInv = rowMax + queryRows;
  float *rowDot = rowInv + queryRows;

  // The softmax statistics of every query row and D = <dy, y> =
  // sum_j P_ij <dy_i, v_j>, summed as the CPU does (in double, over the
  // same dP_ij the dQ pass computes, so that dP_ij - D_i cancels alike:
  // exactly 0 for a row's single key).
  PIPER_RETURN_IF_ERROR(Exec(ctx).forEachRow(
      "attention_grad_stats", queryRows,
      [=] PIPER_LAMBDA(Lanes lanes, int64_t r) {
        withWidth(width, [&](auto w) {
          constexpr int W = decltype(w)::value;
          constexpr int kPer = kMaxHeadDim / Lanes::kCount;
          const int64_t hd = s.headDim;
          int64_t i = r % s.seq, bh = r / s.seq;
          int64_t h = bh % s.heads, b = bh / s.heads;
          AttentionHead view = attentionHeadView(s, src, qkv, dy, b, h);
          float q[kPer], dyr[kPer];
          loadLaneShare<W>(lanes, view.q + i * view.ldq, hd, q);
          loadLaneShare<W>(lanes, view.dy + i * view.lddy, hd, dyr);
          float m = -INFINITY, l = 0;
          double dot = 0; // sum_j exp(s_j - m) dP_j
          for (int64_t base = 0; base <= i; base += Lanes::kCount) {
            const int64_t count = blockCount<Lanes>(base, i);
            float sc = blockDot<W>(lanes, q, view.k + base * view.ldk, view.ldk,
                                   count, hd);
            float dp = blockDot<W>(lanes, dyr, view.v + base * view.ldv,
                                   view.ldv, count, hd);
            const bool valid = lanes.lane() < count;
            float score = valid ? s.scale * sc : -INFINITY;
            float mNew = maxF(m, lanes.max(score));
            float c = expF(m - mNew);
            float p = valid ? expF(score - mNew) : 0.0f;
            l = l * c + lanes.sum(p);
            dot = dot * c + lanes.sum(valid ? double(p) * double(dp) : 0.0);
            m = mNew;
          }
          float inv = 1.0f / l;
          if (lanes.lane() == 0) {
            rowMax[r] = m;
            rowInv[r] = inv;
            rowDot[r] = static_cast<float>(dot * inv);
          }
        });
      }));

  // dQ (of the rotated q) per query row: sum over keys j <= i of dS_ij k_j.
  PIPER_RETURN_IF_ERROR(Exec(ctx).forEachRow(
      "attention_grad_q", queryRows, [=] PIPER_LAMBDA(Lanes lanes, int64_t r) {
        withWidth(width, [&](auto w) {
          constexpr int W = decltype(w)::value;
          constexpr int kPer = kMaxHeadDim / Lanes::kCount;
          const int64_t hd = s.headDim;
          int64_t i = r % s.seq, bh = r / s.seq;
          int64_t h = bh % s.heads, b = bh / s.heads;
          AttentionHead view = attentionHeadView(s, src, qkv, dy, b, h);
          float q[kPer], dyr[kPer], dq[kPer];
          loadLaneShare<W>(lanes, view.q + i * view.ldq, hd, q);
          loadLaneShare<W>(lanes, view.dy + i * view.lddy, hd, dyr);
          zeroLaneShare<W>(lanes, dq, hd);
          const float m = rowMax[r], inv = rowInv[r], dot = rowDot[r];
          for (int64_t base = 0; base <= i; base += Lanes::kCount) {
            const int64_t count = blockCount<Lanes>(base, i);
            const float *k = view.k + base * view.ldk;
            float sc = blockDot<W>(lanes, q, k, view.ldk, count, hd);
            float dp = blockDot<W>(lanes, dyr, view.v + base * view.ldv,
                                   view.ldv, count, hd);
            float ds = 0;
            if (lanes.lane() < count) {
              float score = s.scale * sc;
              float p = expF(score - m) * inv;
              ds = s.scale * p * (dp - dot);
            }
            for (int64_t j = 0; j < count; ++j)
              laneAxpy<W>(lanes, dq, lanes.shuffle(ds, int(j)),
                          k + j * view.ldk, hd);
          }
          storeLaneShare<W>(lanes, dq, 1.0f,
                            dqkv + (b * s.seq + i) * s.cols + h * hd, hd);
        });
      }));

  // dK (of the rotated k) and dV per key row j of a kv head: sums over the
  // group's query heads and their queries i >= j.
  PIPER_RETURN_IF_ERROR(Exec(ctx).forEachRow(
      "attention_grad_kv", s.batch * s.kvHeads * s.seq,
      [=] PIPER_LAMBDA(Lanes lanes, int64_t r) {
        withWidth(width, [&](auto w) {
          constexpr int W = decltype(w)::value;
          constexpr int kPer = kMaxHeadDim / Lanes::kCount;
          const int64_t hd = s.headDim, group = s.group();
          int64_t j = r % s.seq, bg = r / s.seq;
          int64_t g = bg % s.kvHeads, b = bg / s.kvHeads;
          float k[kPer], v[kPer], dk[kPer], dv[kPer];
          {
            AttentionHead view =
                attentionHeadView(s, src, qkv, dy, b, g * group);
            loadLaneShare<W>(lanes, view.k + j * view.ldk, hd, k);
            loadLaneShare<W>(lanes, view.v + j * view.ldv, hd, v);
          }
          zeroLaneShare<W>(lanes, dk, hd);
          zeroLaneShare<W>(lanes, dv, hd);
          for (int64_t h = g * group; h < (g + 1) * group; ++h) {
            AttentionHead view = attentionHeadView(s, src, qkv, dy, b, h);
            const int64_t stats = (b * s.heads + h) * s.seq;
            // Queries j..seq-1, kCount at a time: lane l takes query
            // first + l.
            for (int64_t first = j; first < s.seq; first += Lanes::kCount) {
              const int64_t count = blockCount<Lanes>(first, s.seq - 1);
              const float *q = view.q + first * view.ldq;
              const float *dyRows = view.dy + first * view.lddy;
              float sc = blockDot<W>(lanes, k, q, view.ldq, count, hd);
              float dp = blockDot<W>(lanes, v, dyRows, view.lddy, count, hd);
              float p = 0, ds = 0;
              if (lanes.lane() < count) {
                const int64_t at = stats + first + lanes.lane();
                float score = s.scale * sc;
                p = expF(score - rowMax[at]) * rowInv[at];
                ds = s.scale * p * (dp - rowDot[at]);
              }
              for (int64_t l = 0; l < count; ++l) {
                laneAxpy<W>(lanes, dv, lanes.shuffle(p, int(l)),
                            dyRows + l * view.lddy, hd);
                laneAxpy<W>(lanes, dk, lanes.shuffle(ds, int(l)),
                            q + l * view.ldq, hd);
              }
            }
          }
          float *row = dqkv + (b * s.seq + j) * s.cols + s.qCols + g * hd;
          storeLaneShare<W>(lanes, dk, 1.0f, row, hd);
          storeLaneShare<W>(lanes, dv, 1.0f, row + s.kvCols, hd);
        });
      }));

  if (!s.rotary())
    return Status::ok();
  // Rotates dQ and dK back (the transpose of the rotation), in place: each
  // index reads its pair before writing it.
  const double *cosT =
      reinterpret_cast<const double *>(scratch + layout.cosOffset);
  const double *sinT =
      reinterpret_cast<const double *>(scratch + layout.sinOffset);
  const int64_t half = s.half(), hd = s.headDim, cols = s.cols, seq = s.seq;
  const int64_t pairs = (s.qCols + s.kvCols) / 2;
  return Exec(ctx).forEach(
      "attention_grad_rope", s.rows() * pairs, [=] PIPER_LAMBDA(int64_t idx) {
        int64_t r = idx / pairs, p = idx % pairs;
        int64_t col = (p / half) * hd + p % half;
        int64_t e = (r % seq) * half + p % half;
        float *x = dqkv + r * cols + col;
        float x1 = x[0], x2 = x[half];
        ropePair(x1, x2, cosT[e], sinT[e], true, x[0], x[half]);
      });
}

// The fused path's conversions (AttentionLaunch.h).

size_t attentionRopeTableBytes(const AttentionShape &s) {
  if (!s.rotary())
    return 0;
  return 2 *
         attentionAlign(static_cast<size_t>(s.seq * s.half()) * sizeof(double));
}

Status launchAttentionPackBf16(const Context &ctx, const AttentionShape &s,
                               const float *qkv, uint16_t *qkv16, char *table,
                               const uint16_t *qkvIn16) {
  const int64_t cols = s.cols, rows = s.rows();
  if (!s.rotary())
    return Exec(ctx).forEach(
        "attention_pack_bf16", rows * cols, [=] PIPER_LAMBDA(int64_t idx) {
          qkv16[idx] = qkvIn16 ? qkvIn16[idx] : toBf16(qkv[idx]);
        });
  const size_t tableBytes = attentionRopeTableBytes(s) / 2;
  double *cosT = reinterpret_cast<double *>(table);
  double *sinT = reinterpret_cast<double *>(table + tableBytes);
  const int64_t half = s.half(), hd = s.headDim, seq = s.seq;
  PIPER_RETURN_IF_ERROR(launchRopeTable(ctx, s, cosT, sinT));
  // Per row: (heads + kvHeads) * hd / 2 rotated pairs of q | k, then v's
  // kvCols elements copied (as pairs too, so one index covers two).
  const int64_t rotated = (s.qCols + s.kvCols) / 2, copied = s.kvCols / 2;
  const int64_t perRow = rotated + copied, vStart = s.qCols + s.kvCols;
  return Exec(ctx).forEach(
      "attention_rope_pack_bf16", rows * perRow, [=] PIPER_LAMBDA(int64_t idx) {
        int64_t r = idx / perRow, p = idx % perRow;
        // Element c of the row: fp32, or packed (the same value).
        const float *in = qkvIn16 ? nullptr : qkv + r * cols;
        const uint16_t *in16 = qkvIn16 ? qkvIn16 + r * cols : nullptr;
        auto at = [=](int64_t c) { return in16 ? fromBf16(in16[c]) : in[c]; };
        uint16_t *out = qkv16 + r * cols;
        if (p >= rotated) {
          int64_t c = vStart + 2 * (p - rotated);
          out[c] = toBf16(at(c));
          out[c + 1] = toBf16(at(c + 1));
          return;
        }
        int64_t col = (p / half) * hd + p % half;
        int64_t e = (r % seq) * half + p % half;
        float o1, o2;
        ropePair(at(col), at(col + half), cosT[e], sinT[e], false, o1, o2);
        out[col] = toBf16(o1);
        out[col + half] = toBf16(o2);
      });
}

Status launchAttentionUnpackGradBf16(const Context &ctx,
                                     const AttentionShape &s,
                                     const uint16_t *dqkv16, float *dqkv,
                                     const char *table, bool round,
                                     uint16_t *dqkvOut16) {
  const int64_t cols = s.cols, rows = s.rows();
  if (!s.rotary())
    return Exec(ctx).forEach("attention_grad_unpack_bf16", rows * cols,
                             [=] PIPER_LAMBDA(int64_t idx) {
                               if (dqkvOut16)
                                 dqkvOut16[idx] = dqkv16[idx];
                               else
                                 dqkv[idx] = fromBf16(dqkv16[idx]);
                             });
  const size_t tableBytes = attentionRopeTableBytes(s) / 2;
  const double *cosT = reinterpret_cast<const double *>(table);
  const double *sinT = reinterpret_cast<const double *>(table + tableBytes);
  const int64_t half = s.half(), hd = s.headDim, seq = s.seq;
  const int64_t rotated = (s.qCols + s.kvCols) / 2, copied = s.kvCols / 2;
  const int64_t perRow = rotated + copied, vStart = s.qCols + s.kvCols;
  return Exec(ctx).forEach("attention_grad_rope_unpack_bf16", rows * perRow,
                           [=] PIPER_LAMBDA(int64_t idx) {
                             int64_t r = idx / perRow, p = idx % perRow;
                             const uint16_t *in = dqkv16 + r * cols;
                             if (p >= rotated) {
                               // dv: bf16 values, exact either way.
                               int64_t c = vStart + 2 * (p - rotated);
                               for (int64_t j = c; j < c + 2; ++j) {
                                 if (dqkvOut16)
                                   dqkvOut16[r * cols + j] = in[j];
                                 else
                                   dqkv[r * cols + j] = fromBf16(in[j]);
                               }
                               return;
                             }
                             int64_t col = (p / half) * hd + p % half;
                             int64_t e = (r % seq) * half + p % half;
                             float o1 = 0, o2 = 0;
                             ropePair(fromBf16(in[col]),
                                      fromBf16(in[col + half]), cosT[e],
                                      sinT[e], true, o1, o2);
                             storeRounded(dqkv, dqkvOut16, r * cols + col, o1,
                                          round);
                             storeRounded(dqkv, dqkvOut16,
                                          r * cols + col + half, o2, round);
                           });
}

Status launchStatsToLse(const Context &ctx, const AttentionShape &s,
                        const float *stats, float *lse) {
  const int64_t seq = s.seq, heads = s.heads;
  return Exec(ctx).forEach("attention_stats_to_lse", s.batch * heads * seq,
                           [=] PIPER_LAMBDA(int64_t idx) {
                             int64_t i = idx % seq, bh = idx / seq;
                             int64_t h = bh % heads, b = bh / heads;
                             storeRingLse(lse, heads, b * seq + i, h,
                                          stats[idx]);
                           });
}

Status launchLseToStats(const Context &ctx, const AttentionShape &s,
                        const float *lse, float *stats) {
  const int64_t seq = s.seq, heads = s.heads;
  return Exec(ctx).forEach("attention_lse_to_stats", s.batch * heads * seq,
                           [=] PIPER_LAMBDA(int64_t idx) {
                             int64_t i = idx % seq, bh = idx / seq;
                             int64_t h = bh % heads, b = bh / heads;
                             stats[idx] =
                                 loadRingLse(lse, heads, b * seq + i, h);
                           });
}

// Ring attention (context parallelism, docs/context-parallel.md). A step
// reads the member's q from qkv and the owner's k, v from kv
// ([rows, 2 kvCols]); positions are global (ringPosition), and increase
// with the row within each member's part of a sequence, so the keys a
// query sees are a prefix of the shard and the queries a key is seen by a
// suffix (ringRowsBefore). With rotary embeddings q and k are rotated into
// scratch at those positions (angles computed as the CPU's RopeTable).

// q (member's positions) and k (owner's) rotated into scratch, or qkv's q
// and kv's k.
Status ringPrepareQk(const Context &ctx, const RingShape &s, const float *qkv,
                     const float *kv, char *scratch,
                     const AttentionScratch &layout, AttentionQkSource &qSrc,
                     AttentionQkSource &kSrc) {
  if (!s.rotary()) {
    qSrc = {qkv, s.cols};
    kSrc = {kv, 2 * s.kvCols};
    return Status::ok();
  }
  float *qk = reinterpret_cast<float *>(scratch + layout.qkOffset);
  const int64_t half = s.half(), hd = s.headDim, cols = s.cols;
  const int64_t qCols = s.qCols, kvLd = 2 * s.kvCols;
  const int64_t ldQk = s.qCols + s.kvCols, pairs = ldQk / 2;
  const RingShape shape = s;
  PIPER_RETURN_IF_ERROR(Exec(ctx).forEach(
      "attention_block_rope", s.rows() * pairs, [=] PIPER_LAMBDA(int64_t idx) {
        int64_t r = idx / pairs, p = idx % pairs;
        int64_t col = (p / half) * hd + p % half, t = r % shape.seq;
        bool isQ = col < qCols;
        int64_t pos = ringPosition(shape.globalSeq, shape.cp,
                                   isQ ? shape.member : shape.owner, t);
        const float *in =
            isQ ? qkv + r * cols + col : kv + r * kvLd + (col - qCols);
        double c, sn;
        ropeAngle(shape.ropeTheta, shape.rope, hd, pos, p % half, c, sn);
        float *out = qk + r * ldQk + col;
        ropePair(in[0], in[half], c, sn, false, out[0], out[half]);
      }));
  qSrc = {qk, ldQk};
  kSrc = {qk + s.qCols, ldQk};
  return Status::ok();
}

// The (sequence b, query head h) view of a ring step.
PIPER_HOST_DEVICE inline AttentionHead
ringHeadView(const RingShape &s, AttentionQkSource qSrc, AttentionQkSource kSrc,
             const float *kv, const float *dy, int64_t b, int64_t h) {
  int64_t g = h / s.group(), hd = s.headDim, l = s.seq;
  AttentionHead view;
  view.q = qSrc.q + b * l * qSrc.ld + h * hd;
  view.k = kSrc.q + b * l * kSrc.ld + g * hd;
  view.v = kv + s.kvCols + b * l * 2 * s.kvCols + g * hd;
  view.dy = dy ? dy + b * l * s.qCols + h * hd : nullptr;
  view.ldq = qSrc.ld;
  view.ldk = kSrc.ld;
  view.ldv = 2 * s.kvCols;
  view.lddy = s.qCols;
  return view;
}

// 4 when hd is a multiple of 4 and every row pointer is 16-byte aligned.
inline int ringWidth(const RingShape &s,
                     std::initializer_list<const void *> ps) {
  if (s.headDim % 4 != 0)
    return 1;
  for (const void *p : ps)
    if (p && reinterpret_cast<uintptr_t>(p) % 16 != 0)
      return 1;
  return 4;
}

Status launchAttentionBlock(const Context &ctx, const RingShape &s,
                            const float *qkv, const float *kv, const float *oIn,
                            const float *lseIn, float *o, float *lse,
                            char *scratch) {
  using Lanes = Exec::Lanes;
  AttentionScratch layout = ringScratch(s, false);
  AttentionQkSource qSrc, kSrc;
  PIPER_RETURN_IF_ERROR(
      ringPrepareQk(ctx, s, qkv, kv, scratch, layout, qSrc, kSrc));
  const int width = ringWidth(s, {qSrc.q, kSrc.q, kv, oIn, o});
  return Exec(ctx).forEachRow(
      "attention_block", s.batch * s.heads * s.seq,
      [=] PIPER_LAMBDA(Lanes lanes, int64_t r) {
        withWidth(width, [&](auto w) {
          constexpr int W = decltype(w)::value;
          constexpr int kPer = kMaxHeadDim / Lanes::kCount;
          const int64_t hd = s.headDim;
          int64_t i = r % s.seq, bh = r / s.seq;
          int64_t h = bh % s.heads, b = bh / s.heads;
          AttentionHead view = ringHeadView(s, qSrc, kSrc, kv, nullptr, b, h);
          int64_t pos = ringPosition(s.globalSeq, s.cp, s.member, i);
          int64_t last = ringRowsBefore(s, s.owner, pos, true) - 1;
          float acc[kPer];
          float m, l;
          attendRow<W>(lanes, s, view, i, last, acc, m, l);
          const int64_t row = b * s.seq + i;
          float lb = last < 0 ? -INFINITY
                              : static_cast<float>(double(m) + log(double(l)));
          float inv = last < 0 ? 0.0f : 1.0f / l;
          float *out = o + row * s.qCols + h * hd;
          PIPER_ATTENTION_UNROLL
          for (int t = 0; t < kPer; ++t) {
            if (laneElement<W>(lanes, t) >= hd)
              break;
            acc[t] *= inv;
          }
          float lsOut = lb;
          if (oIn) {
            // Combined with the earlier steps by their log-sum-exps, in
            // double as the CPU does.
            float la = loadRingLse(lseIn, s.heads, row, h);
            float old[kPer];
            loadLaneShare<W>(lanes, oIn + row * s.qCols + h * hd, hd, old);
            if (lb == -INFINITY) {
              lsOut = la;
              PIPER_ATTENTION_UNROLL
              for (int t = 0; t < kPer; ++t) {
                if (laneElement<W>(lanes, t) >= hd)
                  break;
                acc[t] = old[t];
              }
            } else if (la != -INFINITY) {
              double hi = la > lb ? la : lb, lo = la > lb ? lb : la;
              double sum = hi + log1p(exp(lo - hi));
              double wa = exp(double(la) - sum), wb = exp(double(lb) - sum);
              PIPER_ATTENTION_UNROLL
              for (int t = 0; t < kPer; ++t) {
                if (laneElement<W>(lanes, t) >= hd)
                  break;
                acc[t] = static_cast<float>(wa * old[t] + wb * acc[t]);
              }
              lsOut = static_cast<float>(sum);
            }
          }
          storeLaneShare<W>(lanes, acc, 1.0f, out, hd);
          if (lanes.lane() == 0)
            storeRingLse(lse, s.heads, row, h, lsOut);
        });
      });
}

Status launchAttentionBlockGrad(const Context &ctx, const RingShape &s,
                                const float *qkv, const float *kv,
                                const float *y, const float *lse,
                                const float *dy, const float *dqIn,
                                const float *dkvIn, float *dq, float *dkv,
                                char *scratch) {
  using Lanes = Exec::Lanes;
  AttentionScratch layout = ringScratch(s, true);
  AttentionQkSource qSrc, kSrc;
  PIPER_RETURN_IF_ERROR(
      ringPrepareQk(ctx, s, qkv, kv, scratch, layout, qSrc, kSrc));
  const int width = ringWidth(s, {qSrc.q, kSrc.q, kv, y, dy});
  const int64_t queryRows = s.batch * s.heads * s.seq;
  float *rowDot = reinterpret_cast<float *>(scratch + layout.statsOffset);

  // D = <dy, y> per query row, summed in double as the CPU does.
  PIPER_RETURN_IF_ERROR(Exec(ctx).forEachRow(
      "attention_block_grad_dot", queryRows,
      [=] PIPER_LAMBDA(Lanes lanes, int64_t r) {
        withWidth(width, [&](auto w) {
          constexpr int W = decltype(w)::value;
          constexpr int kPer = kMaxHeadDim / Lanes::kCount;
          const int64_t hd = s.headDim;
          int64_t i = r % s.seq, bh = r / s.seq;
          int64_t h = bh % s.heads, b = bh / s.heads;
          const int64_t at = (b * s.seq + i) * s.qCols + h * hd;
          float dyr[kPer], yr[kPer];
          loadLaneShare<W>(lanes, dy + at, hd, dyr);
          loadLaneShare<W>(lanes, y + at, hd, yr);
          double part = 0;
          PIPER_ATTENTION_UNROLL
          for (int t = 0; t < kPer; ++t) {
            if (laneElement<W>(lanes, t) >= hd)
              break;
            part += double(dyr[t]) * double(yr[t]);
          }
          double dot = lanes.sum(part);
          if (lanes.lane() == 0)
            rowDot[r] = static_cast<float>(dot);
        });
      }));

  // dQ (rotated) per query row over the keys it sees:
  // P_ij = exp(s_ij - lse_i), dS_ij = scale P_ij (<dy_i, v_j> - D_i).
  PIPER_RETURN_IF_ERROR(Exec(ctx).forEachRow(
      "attention_block_grad_q", queryRows,
      [=] PIPER_LAMBDA(Lanes lanes, int64_t r) {
        withWidth(width, [&](auto w) {
          constexpr int W = decltype(w)::value;
          constexpr int kPer = kMaxHeadDim / Lanes::kCount;
          const int64_t hd = s.headDim;
          int64_t i = r % s.seq, bh = r / s.seq;
          int64_t h = bh % s.heads, b = bh / s.heads;
          AttentionHead view = ringHeadView(s, qSrc, kSrc, kv, dy, b, h);
          int64_t pos = ringPosition(s.globalSeq, s.cp, s.member, i);
          int64_t last = ringRowsBefore(s, s.owner, pos, true) - 1;
          float q[kPer], dyr[kPer], dqr[kPer];
          loadLaneShare<W>(lanes, view.q + i * view.ldq, hd, q);
          loadLaneShare<W>(lanes, view.dy + i * view.lddy, hd, dyr);
          zeroLaneShare<W>(lanes, dqr, hd);
          const float li = loadRingLse(lse, s.heads, b * s.seq + i, h),
                      dot = rowDot[r];
          for (int64_t base = 0; base <= last; base += Lanes::kCount) {
            const int64_t count = blockCount<Lanes>(base, last);
            const float *k = view.k + base * view.ldk;
            float sc = blockDot<W>(lanes, q, k, view.ldk, count, hd);
            float dp = blockDot<W>(lanes, dyr, view.v + base * view.ldv,
                                   view.ldv, count, hd);
            float ds = 0;
            if (lanes.lane() < count) {
              float p = expF(s.scale * sc - li);
              ds = s.scale * p * (dp - dot);
            }
            for (int64_t j = 0; j < count; ++j)
              laneAxpy<W>(lanes, dqr, lanes.shuffle(ds, int(j)),
                          k + j * view.ldk, hd);
          }
          storeLaneShare<W>(lanes, dqr, 1.0f,
                            dq + (b * s.seq + i) * s.qCols + h * hd, hd);
        });
      }));

  // dK (rotated) and dV per key row j of a kv head: the group's query heads
  // and the queries that see it.
  PIPER_RETURN_IF_ERROR(Exec(ctx).forEachRow(
      "attention_block_grad_kv", s.batch * s.kvHeads * s.seq,
      [=] PIPER_LAMBDA(Lanes lanes, int64_t r) {
        withWidth(width, [&](auto w) {
          constexpr int W = decltype(w)::value;
          constexpr int kPer = kMaxHeadDim / Lanes::kCount;
          const int64_t hd = s.headDim, group = s.group();
          int64_t j = r % s.seq, bg = r / s.seq;
          int64_t g = bg % s.kvHeads, b = bg / s.kvHeads;
          int64_t pos = ringPosition(s.globalSeq, s.cp, s.owner, j);
          int64_t first = ringRowsBefore(s, s.member, pos, false);
          float k[kPer], v[kPer], dk[kPer], dv[kPer];
          {
            AttentionHead view =
                ringHeadView(s, qSrc, kSrc, kv, dy, b, g * group);
            loadLaneShare<W>(lanes, view.k + j * view.ldk, hd, k);
            loadLaneShare<W>(lanes, view.v + j * view.ldv, hd, v);
          }
          zeroLaneShare<W>(lanes, dk, hd);
          zeroLaneShare<W>(lanes, dv, hd);
          for (int64_t h = g * group; h < (g + 1) * group; ++h) {
            AttentionHead view = ringHeadView(s, qSrc, kSrc, kv, dy, b, h);
            const int64_t stats = (b * s.heads + h) * s.seq;
            for (int64_t at = first; at < s.seq; at += Lanes::kCount) {
              const int64_t count = blockCount<Lanes>(at, s.seq - 1);
              const float *q = view.q + at * view.ldq;
              const float *dyRows = view.dy + at * view.lddy;
              float sc = blockDot<W>(lanes, k, q, view.ldq, count, hd);
              float dp = blockDot<W>(lanes, v, dyRows, view.lddy, count, hd);
              float p = 0, ds = 0;
              if (lanes.lane() < count) {
                const int64_t i = at + lanes.lane();
                p = expF(s.scale * sc -
                         loadRingLse(lse, s.heads, b * s.seq + i, h));
                ds = s.scale * p * (dp - rowDot[stats + i]);
              }
              for (int64_t l = 0; l < count; ++l) {
                laneAxpy<W>(lanes, dv, lanes.shuffle(p, int(l)),
                            dyRows + l * view.lddy, hd);
                laneAxpy<W>(lanes, dk, lanes.shuffle(ds, int(l)),
                            q + l * view.ldq, hd);
              }
            }
          }
          float *row = dkv + (b * s.seq + j) * 2 * s.kvCols + g * hd;
          storeLaneShare<W>(lanes, dk, 1.0f, row, hd);
          storeLaneShare<W>(lanes, dv, 1.0f, row + s.kvCols, hd);
        });
      }));

  // dQ and dK rotated back at their positions, in place, then the given
  // partial sums added.
  const int64_t half = s.half(), hd = s.headDim, qCols = s.qCols;
  const int64_t kvLd = 2 * s.kvCols;
  const RingShape shape = s;
  if (s.rotary()) {
    const int64_t pairs = (s.qCols + s.kvCols) / 2;
    PIPER_RETURN_IF_ERROR(Exec(ctx).forEach(
        "attention_block_grad_rope", s.rows() * pairs,
        [=] PIPER_LAMBDA(int64_t idx) {
          int64_t r = idx / pairs, p = idx % pairs;
          int64_t col = (p / half) * hd + p % half, t = r % shape.seq;
          bool isQ = col < qCols;
          int64_t pos = ringPosition(shape.globalSeq, shape.cp,
                                     isQ ? shape.member : shape.owner, t);
          float *x =
              isQ ? dq + r * qCols + col : dkv + r * kvLd + (col - qCols);
          double c, sn;
          ropeAngle(shape.ropeTheta, shape.rope, hd, pos, p % half, c, sn);
          float x1 = x[0], x2 = x[half];
          ropePair(x1, x2, c, sn, true, x[0], x[half]);
        }));
  }
  if (!dqIn)
    return Status::ok();
  PIPER_RETURN_IF_ERROR(Exec(ctx).forEach(
      "attention_block_grad_add_q", s.rows() * qCols,
      [=] PIPER_LAMBDA(int64_t idx) { dq[idx] += dqIn[idx]; }));
  return Exec(ctx).forEach(
      "attention_block_grad_add_kv", s.rows() * kvLd,
      [=] PIPER_LAMBDA(int64_t idx) { dkv[idx] += dkvIn[idx]; });
}

} // namespace piper::runtime::hal::PIPER_GPU_NS
