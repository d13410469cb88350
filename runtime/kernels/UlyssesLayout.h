// The layouts around Ulysses context parallelism's all-to-alls
// (docs/context-parallel.md §2), shared by the CPU kernels and the GPU
// kernels' bodies (plain data, no dependencies; host and device code).
//
// A member of a context-parallel group of `cp` holds `n` rows: B sequences
// of seq / cp rows each, chunks m and 2 cp - 1 - m of the 2 cp equal chunks
// of every sequence. Before attention, its wide rows [n, W] (W = (heads +
// 2 kv_heads) hd: query heads, then key heads, then value heads) go out as
// cp narrow blocks [n, W / cp], block j holding member j's heads (query
// heads j heads / cp ... and the same share of the key and value heads):
// the *split*. After the all-to-all a member holds cp blocks, block i
// member i's rows; the *natural* order puts them in sequence order, [B
// seq, W / cp]. After attention the other way: *zigzag* (natural rows back
// into member blocks), the all-to-all, *merge* (the cp narrow blocks of a
// member's rows side by side as its wide rows).
#ifndef PIPER_RUNTIME_KERNELS_ULYSSESLAYOUT_H
#define PIPER_RUNTIME_KERNELS_ULYSSESLAYOUT_H

#include <cstdint>

#if defined(__CUDACC__)
#define PIPER_ULYSSES_FN __host__ __device__ inline
#else
#define PIPER_ULYSSES_FN inline
#endif

namespace piper::runtime {

/// The columns: `heads` query heads then `kvHeads` key and `kvHeads` value
/// heads (kvHeads 0: query heads only, an attention output), of `hd`
/// columns each, split over `cp` members (heads and kvHeads multiples of
/// cp).
struct UlyssesColumns {
  int64_t cp = 1, heads = 0, kvHeads = 0, hd = 0;

  PIPER_ULYSSES_FN int64_t wide() const { return (heads + 2 * kvHeads) * hd; }
  PIPER_ULYSSES_FN int64_t narrow() const { return wide() / cp; }
  /// The wide column that column `c` of member `j`'s narrow block holds.
  PIPER_ULYSSES_FN int64_t wideColumn(int64_t j, int64_t c) const {
    int64_t q = heads / cp * hd, kv = kvHeads / cp * hd;
    if (c < q)
      return j * q + c;
    c -= q;
    int64_t group = c / kv; // 0: keys, 1: values
    return heads * hd + group * kvHeads * hd + j * kv + c % kv;
  }
  /// The member whose narrow block holds wide column `w`, and the column
  /// there (the inverse of wideColumn).
  PIPER_ULYSSES_FN void narrowColumn(int64_t w, int64_t &j, int64_t &c) const {
    int64_t q = heads / cp * hd, kv = kvHeads / cp * hd;
    if (w < heads * hd) {
      j = w / q;
      c = w % q;
      return;
    }
    w -= heads * hd;
    int64_t group = w / (kvHeads * hd), at = w % (kvHeads * hd);
    j = at / kv;
    c = q + group * kv + at % kv;
  }
};

/// The rows: `rows` = B seq rows of whole sequences of `seq` tokens, in
/// sequence order (natural) or as cp blocks of B seq / cp rows, block i
/// member i's rows (member order); seq a multiple of 2 cp.
struct UlyssesRows {
  int64_t cp = 1, seq = 0, rows = 0;

  /// The natural row of member-order row `r`.
  PIPER_ULYSSES_FN int64_t naturalRow(int64_t r) const {
    int64_t n = rows / cp, local = seq / cp, chunk = seq / (2 * cp);
    int64_t i = r / n, b = (r % n) / local, t = (r % n) % local;
    int64_t pos = t < chunk ? i * chunk + t
                            : (2 * cp - 1 - i) * chunk + (t - chunk);
    return b * seq + pos;
  }
  /// The member-order row of natural row `p` (the inverse of naturalRow).
  PIPER_ULYSSES_FN int64_t memberRow(int64_t p) const {
    int64_t n = rows / cp, local = seq / cp, chunk = seq / (2 * cp);
    int64_t b = p / seq, pos = p % seq, k = pos / chunk;
    int64_t i = k < cp ? k : 2 * cp - 1 - k;
    int64_t t = k < cp ? pos % chunk : chunk + pos % chunk;
    return i * n + b * local + t;
  }
};

} // namespace piper::runtime

#undef PIPER_ULYSSES_FN

#endif // PIPER_RUNTIME_KERNELS_ULYSSESLAYOUT_H
