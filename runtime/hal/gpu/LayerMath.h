// The math of the layer GPU kernels (layer norm and RMS norm row
// statistics, the chunking of column sums and of the embedding gradient's
// sort), compiled for the device by nvcc and for the host by g++ (Simt.h).
// The statistics follow the CPU kernels (runtime/kernels/NormKernels.cpp)
// operation for operation in double; only the order of the row sums
// differs (lanes instead of the CPU's 8 interleaved accumulators), far
// inside float's rounding.
#ifndef PIPER_RUNTIME_HAL_GPU_LAYERMATH_H
#define PIPER_RUNTIME_HAL_GPU_LAYERMATH_H

#include <cmath>
#include <cstdint>

#include "runtime/hal/gpu/ElementwiseMath.h"
#include "runtime/hal/gpu/Simt.h"

namespace piper::runtime::hal::PIPER_GPU_NS {

/// Mean and 1/sqrt(biased variance + eps) of the row x[0, hidden), two-pass
/// in double; every lane gets both. All lanes must call it.
template <class Lanes, class Row>
PIPER_HOST_DEVICE inline void layerNormStats(Lanes lanes, const Row &x,
                                             int64_t hidden, double eps,
                                             double &mean, double &rstd) {
  double s = 0;
  for (int64_t j = lanes.lane(); j < hidden; j += Lanes::kCount)
    s += x[j];
  s = lanes.sum(s);
  mean = hidden ? s / hidden : 0.0;
  double v = 0;
  for (int64_t j = lanes.lane(); j < hidden; j += Lanes::kCount) {
    double d = x[j] - mean;
    v += d * d;
  }
  v = lanes.sum(v);
  double var = hidden ? v / hidden : 0.0;
  rstd = 1.0 / sqrt(var + eps);
}

/// 1/sqrt(mean(x^2) + eps) of the row x[0, hidden), in double; every lane
/// gets it. All lanes must call it.
template <class Lanes, class Row>
PIPER_HOST_DEVICE inline double rmsNormRrms(Lanes lanes, const Row &x,
                                            int64_t hidden, double eps) {
  double s = 0;
  for (int64_t j = lanes.lane(); j < hidden; j += Lanes::kCount)
    s += double(x[j]) * double(x[j]);
  s = lanes.sum(s);
  return 1.0 / sqrt((hidden ? s / hidden : 0.0) + eps);
}

/// How a column sum over `rows` rows is split: `chunks` chunks of
/// `rowsPerChunk` consecutive rows (the last may be shorter), each summed
/// by one thread per column into a double partial, then the partials are
/// added in chunk order. Depends on `rows` only, so the result does not
/// depend on the launch.
/// position_add's rows (runtime/kernels/LayerChecks.h PositionDims):
/// sequences of `seq` tokens, `local` rows of each on this rank, which are
/// context member `member` of `cp`'s chunks m and 2 cp - 1 - m.
struct PositionMap {
  int64_t seq, local, cp, member;
  /// The global position of local row t of a sequence.
  PIPER_HOST_DEVICE int64_t position(int64_t t) const {
    if (cp == 1)
      return t;
    int64_t chunk = seq / (2 * cp);
    return t < chunk ? member * chunk + t
                     : (2 * cp - 1 - member) * chunk + (t - chunk);
  }
};

struct RowChunks {
  int64_t rowsPerChunk = 1;
  int64_t chunks = 0;
};

/// At least kMinChunkRows rows per chunk (enough work per thread), at most
/// kMaxChunks chunks (bounds the partials: kMaxChunks x columns doubles).
constexpr int64_t kMinChunkRows = 64;
constexpr int64_t kMaxChunks = 256;

inline RowChunks columnChunks(int64_t rows) {
  RowChunks c;
  int64_t spread = (rows + kMaxChunks - 1) / kMaxChunks;
  c.rowsPerChunk = spread > kMinChunkRows ? spread : kMinChunkRows;
  c.chunks = (rows + c.rowsPerChunk - 1) / c.rowsPerChunk;
  return c;
}

/// The embedding gradient's counting sort of the token rows by id: chunks
/// of consecutive rows, each counted and scattered by one thread into its
/// own histogram row (chunks x vocab int32), so the sorted order is the
/// stable one (token order within an id) without atomics. At least
/// kMinSortRows rows per chunk (a chunk's count and scatter are sequential:
/// the sort's latency); at most kSortHistogram histogram entries (32 MiB)
/// and kMaxChunks chunks.
constexpr int64_t kMinSortRows = 64;
constexpr int64_t kSortHistogram = int64_t(1) << 23;

inline RowChunks sortChunks(int64_t rows, int64_t vocab) {
  int64_t maxChunks = vocab > 0 ? kSortHistogram / vocab : kMaxChunks;
  if (maxChunks > kMaxChunks)
    maxChunks = kMaxChunks;
  if (maxChunks < 1)
    maxChunks = 1;
  RowChunks c;
  int64_t spread = (rows + maxChunks - 1) / maxChunks;
  c.rowsPerChunk = spread > kMinSortRows ? spread : kMinSortRows;
  c.chunks = (rows + c.rowsPerChunk - 1) / c.rowsPerChunk;
  return c;
}

/// Ids per warp of the bucket starts' scan (32 per lane on a GPU).
constexpr int64_t kScanTile = 1024;

/// int32 words of the embedding gradient's scratch: the histogram (chunks x
/// vocab), the bucket starts (vocab + 1), the sorted rows (rows) and the
/// scan tiles' starts.
inline int64_t embeddingGradScratchWords(int64_t rows, int64_t vocab) {
  return sortChunks(rows, vocab).chunks * vocab + vocab + 1 + rows +
         (vocab + kScanTile - 1) / kScanTile;
}

/// Replaces x[0, n) by its exclusive prefix sums and returns the total, in
/// every lane. Lane l scans a contiguous block of ceil(n / kCount); the
/// totals of the blocks before it come from one reduction per lane. All
/// lanes must call it.
template <class Lanes>
PIPER_HOST_DEVICE inline int64_t exclusiveScan(Lanes lanes, int32_t *x,
                                               int64_t n) {
  const int64_t block = (n + Lanes::kCount - 1) / Lanes::kCount;
  const int64_t begin = lanes.lane() * block;
  const int64_t end = begin + block < n ? begin + block : n;
  int64_t mine = 0;
  for (int64_t i = begin; i < end; ++i)
    mine += x[i];
  int64_t before = 0;
  for (int l = 0; l < Lanes::kCount; ++l) {
    int64_t other = lanes.sum(lanes.lane() == l ? mine : int64_t(0));
    if (l < lanes.lane())
      before += other;
  }
  const int64_t total = lanes.sum(mine);
  for (int64_t i = begin; i < end; ++i) {
    int64_t size = x[i];
    x[i] = static_cast<int32_t>(before);
    before += size;
  }
  return total;
}

} // namespace piper::runtime::hal::PIPER_GPU_NS

#endif // PIPER_RUNTIME_HAL_GPU_LAYERMATH_H
