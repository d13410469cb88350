// The elementwise launchers' bodies, written once: included by
// Elementwise.cu (Exec = CudaExec) and ElementwiseHost.cpp (Exec =
// HostExec), after `Exec` is declared in this namespace.

namespace piper::runtime::hal::PIPER_GPU_NS {

Status launchGelu(const Context &ctx, RowIn x, float *y, int64_t n, bool round,
                  uint16_t *y16) {
  return Exec(ctx).forEach("gelu", n, [=] PIPER_LAMBDA(int64_t i) {
    storeRounded(y, y16, i, geluForward(x[i]), round);
  });
}

Status launchGeluGrad(const Context &ctx, RowIn x, RowIn dy, float *dx,
                      int64_t n, bool round, uint16_t *dx16) {
  return Exec(ctx).forEach("gelu_grad", n, [=] PIPER_LAMBDA(int64_t i) {
    storeRounded(dx, dx16, i, geluBackward(x[i], dy[i]), round);
  });
}

Status launchSwiglu(const Context &ctx, RowIn gateUp, float *y, int64_t rows,
                    int64_t width, bool round, uint16_t *y16) {
  return Exec(ctx).forEach("swiglu", rows * width, [=] PIPER_LAMBDA(int64_t i) {
    int64_t r = i / width, j = i % width;
    const RowIn row{gateUp.f32, gateUp.bf16, gateUp.at + r * 2 * width};
    storeRounded(y, y16, i, swigluForward(row[j], row[width + j]), round);
  });
}

Status launchSwigluGrad(const Context &ctx, RowIn gateUp, RowIn dy,
                        float *dgateUp, int64_t rows, int64_t width, bool round,
                        uint16_t *dgateUp16) {
  return Exec(ctx).forEach(
      "swiglu_grad", rows * width, [=] PIPER_LAMBDA(int64_t i) {
        int64_t r = i / width, j = i % width;
        const RowIn row{gateUp.f32, gateUp.bf16, gateUp.at + r * 2 * width};
        const int64_t at = r * 2 * width + j;
        float dGate = 0, dUp = 0;
        swigluBackward(row[j], row[width + j], dy[i], dGate, dUp);
        storeRounded(dgateUp, dgateUp16, at, dGate, round);
        storeRounded(dgateUp, dgateUp16, at + width, dUp, round);
      });
}

Status launchAdd(const Context &ctx, RowIn a, RowIn b, float *y, int64_t n,
                 bool round, uint16_t *y16) {
  return Exec(ctx).forEach("add", n, [=] PIPER_LAMBDA(int64_t i) {
    storeRounded(y, y16, i, a[i] + b[i], round);
  });
}

Status launchAdamwBatch(const Context &ctx, const AdamwBatch &batch,
                        const AdamwConstants *constants,
                        const float *clipFactor) {
  const AdamwBatch b = batch; // the kernel's arguments
  return Exec(ctx).forEach(
      "adamw", b.offset[b.count], [=] PIPER_LAMBDA(int64_t i) {
        // The gradient times the clip factor (a float product, as the
        // CPU's); a diverged step (a factor not finite) updates nothing.
        const float clip = clipFactor ? *clipFactor : 1.0f;
        if (!finiteFloat(clip))
          return;
        const int lo = batchEntryOf(b.offset, b.count, i);
        const int64_t e = i - b.offset[lo];
        float &param = b.param[lo][e];
        adamwElement(constants[b.constantsOf[lo]], b.grad[lo][e] * clip,
                     param, b.m[lo][e], b.v[lo][e]);
        if (b.copy[lo])
          b.copy[lo][e] = fromBf16(toBf16(param));
        else if (b.copy16[lo])
          b.copy16[lo][e] = toBf16(param);
      });
}

Status launchPackBf16(const Context &ctx, uint16_t *dst, const float *src,
                      int64_t n) {
  return Exec(ctx).forEach(
      "pack_bf16", n, [=] PIPER_LAMBDA(int64_t i) { dst[i] = toBf16(src[i]); });
}

Status launchPackBf16Columns(const Context &ctx, uint16_t *dst, int64_t dstLd,
                             const float *src, int64_t srcLd, int64_t rows,
                             int64_t cols) {
  return Exec(ctx).forEach("pack_bf16", rows * cols,
                           [=] PIPER_LAMBDA(int64_t i) {
                             const int64_t c = i / rows, r = i - c * rows;
                             dst[c * dstLd + r] = toBf16(src[c * srcLd + r]);
                           });
}

Status launchUnpackBf16(const Context &ctx, float *dst, const uint16_t *src,
                        int64_t n) {
  return Exec(ctx).forEach("unpack_bf16", n, [=] PIPER_LAMBDA(int64_t i) {
    dst[i] = fromBf16(src[i]);
  });
}

Status launchRoundBf16(const Context &ctx, float *x, int64_t n) {
  return Exec(ctx).forEach("round_bf16", n, [=] PIPER_LAMBDA(int64_t i) {
    x[i] = fromBf16(toBf16(x[i]));
  });
}

Status launchRoundBf16Rows(const Context &ctx, float *x, int64_t rows,
                           int64_t cols, int64_t ld) {
  if (ld == cols)
    return launchRoundBf16(ctx, x, rows * cols);
  return Exec(ctx).forEach("round_bf16", rows * cols,
                           [=] PIPER_LAMBDA(int64_t i) {
                             const int64_t r = i / cols, c = i - r * cols;
                             float &v = x[r * ld + c];
                             v = fromBf16(toBf16(v));
                           });
}

Status launchSumsOfSquares(const Context &ctx, const SquaresBatch &batch,
                           double *partials) {
  using Lanes = Exec::Lanes;
  const SquaresBatch b = batch; // the kernels' arguments
  PIPER_RETURN_IF_ERROR(Exec(ctx).forEachRow(
      "sum_of_squares", b.firstChunk[b.count],
      [=] PIPER_LAMBDA(Lanes lanes, int64_t c) {
        const int lo = batchEntryOf(b.firstChunk, b.count, c);
        const float *x = b.x[lo];
        const int64_t n = b.n[lo];
        int64_t begin = (c - b.firstChunk[lo]) * kSquaresChunk;
        int64_t end = begin + kSquaresChunk < n ? begin + kSquaresChunk : n;
        double s = 0;
        for (int64_t i = begin + lanes.lane(); i < end; i += Lanes::kCount)
          s += double(x[i]) * double(x[i]);
        s = lanes.sum(s);
        if (lanes.lane() == 0)
          partials[c] = s;
      }));
  return Exec(ctx).forEachRow(
      "sum_of_squares", b.count, [=] PIPER_LAMBDA(Lanes lanes, int64_t j) {
        const int64_t first = b.firstChunk[j],
                      chunks = b.firstChunk[j + 1] - first;
        double s = 0;
        for (int64_t c = lanes.lane(); c < chunks; c += Lanes::kCount)
          s += partials[first + c];
        s = lanes.sum(s);
        if (lanes.lane() == 0)
          *b.result[j] = s;
      });
}

Status launchWeighSquares(const Context &ctx, const double *slots,
                          const double *weights, int64_t count, double *total) {
  // One thread: a few hundred slots, added in the host loop's order.
  return Exec(ctx).forEach("weigh_squares", 1, [=] PIPER_LAMBDA(int64_t) {
    double t = 0;
    for (int64_t i = 0; i < count; ++i)
      t += slots[i] * weights[i];
    *total = t;
  });
}

Status launchClipFactor(const Context &ctx, const double *total,
                        double replicas, double maxNorm, double *norm,
                        float *factor) {
  return Exec(ctx).forEach("clip_factor", 1, [=] PIPER_LAMBDA(int64_t) {
    double n = sqrt(*total / replicas);
    *norm = n;
    *factor = clipFactorOf(n, maxNorm);
  });
}

// A captured all-to-all's blocks. One thread checks the counts and lays out
// the offsets (members is small: a group's size), then the rows move in
// units of 4, 2 or 1 bytes, whichever divides a row.

namespace rowblocks {

template <class Unit>
Status packRows(const Context &ctx, const RowBlocks &b, const void *input,
                void *blocks, const int32_t *sent, const int64_t *offsets) {
  const int64_t units = b.rowBytes / int64_t(sizeof(Unit));
  const int64_t perBlock = b.blockRows * units;
  const Unit *in = static_cast<const Unit *>(input);
  Unit *out = static_cast<Unit *>(blocks);
  return Exec(ctx).forEach(
      "pack_row_blocks", b.members * perBlock, [=] PIPER_LAMBDA(int64_t i) {
        const int64_t j = i / perBlock, r = (i % perBlock) / units,
                      u = i % units;
        if (r < sent[j])
          out[i] = in[(offsets[j] + r) * units + u];
      });
}

template <class Unit>
Status unpackRows(const Context &ctx, const RowBlocks &b, const void *blocks,
                  void *output, const int64_t *offsets) {
  const int64_t units = b.rowBytes / int64_t(sizeof(Unit));
  const int64_t members = b.members, blockRows = b.blockRows;
  const Unit *in = static_cast<const Unit *>(blocks);
  Unit *out = static_cast<Unit *>(output);
  return Exec(ctx).forEach(
      "unpack_row_blocks", b.rows * units, [=] PIPER_LAMBDA(int64_t i) {
        const int64_t row = i / units, u = i % units;
        Unit v = 0;
        for (int64_t j = 0; j < members; ++j)
          if (row >= offsets[j] && row < offsets[j + 1]) {
            v = in[(j * blockRows + row - offsets[j]) * units + u];
            break;
          }
        out[i] = v;
      });
}

} // namespace rowblocks

Status launchPackRowBlocks(const Context &ctx, const RowBlocks &shape,
                           const void *input, const int32_t *counts,
                           void *blocks, int32_t *sent, int32_t *fault,
                           int64_t *offsets) {
  const RowBlocks b = shape;
  PIPER_RETURN_IF_ERROR(
      Exec(ctx).forEach("pack_row_blocks", 1, [=] PIPER_LAMBDA(int64_t) {
        int32_t code = 0;
        int64_t sum = 0;
        for (int64_t j = 0; j < b.members; ++j) {
          if ((counts[j] < 0 || counts[j] > b.blockRows) && !code)
            code = int32_t(RowBlockFault::kCount);
          sum += counts[j] > 0 ? counts[j] : 0;
        }
        if (!code && sum > b.rows)
          code = int32_t(RowBlockFault::kInput);
        offsets[0] = 0;
        for (int64_t j = 0; j < b.members; ++j) {
          sent[j] = code ? -1 : counts[j];
          offsets[j + 1] = offsets[j] + (code ? 0 : counts[j]);
        }
        if (code && !*fault)
          *fault = code;
      }));
  if (b.rowBytes % 4 == 0)
    return rowblocks::packRows<uint32_t>(ctx, b, input, blocks, sent, offsets);
  if (b.rowBytes % 2 == 0)
    return rowblocks::packRows<uint16_t>(ctx, b, input, blocks, sent, offsets);
  return rowblocks::packRows<uint8_t>(ctx, b, input, blocks, sent, offsets);
}

Status launchUnpackRowBlocks(const Context &ctx, const RowBlocks &shape,
                             const void *blocks, const int32_t *received,
                             void *output, int32_t *fault, int64_t *offsets) {
  const RowBlocks b = shape;
  PIPER_RETURN_IF_ERROR(
      Exec(ctx).forEach("unpack_row_blocks", 1, [=] PIPER_LAMBDA(int64_t) {
        int32_t code = 0;
        int64_t sum = 0;
        for (int64_t j = 0; j < b.members && !code; ++j) {
          if (received[j] < 0)
            code = int32_t(RowBlockFault::kPeer);
          else if (received[j] > b.blockRows)
            code = int32_t(RowBlockFault::kCount);
          else
            sum += received[j];
        }
        if (!code && sum > b.rows)
          code = int32_t(RowBlockFault::kOutput);
        offsets[0] = 0;
        for (int64_t j = 0; j < b.members; ++j)
          offsets[j + 1] = offsets[j] + (code ? 0 : received[j]);
        if (code && !*fault)
          *fault = code;
      }));
  if (b.rowBytes % 4 == 0)
    return rowblocks::unpackRows<uint32_t>(ctx, b, blocks, output, offsets);
  if (b.rowBytes % 2 == 0)
    return rowblocks::unpackRows<uint16_t>(ctx, b, blocks, output, offsets);
  return rowblocks::unpackRows<uint8_t>(ctx, b, blocks, output, offsets);
}

} // namespace piper::runtime::hal::PIPER_GPU_NS
