// Internal to runtime/kernels: a parallel loop for the elementwise and
// row-wise kernels, on as many threads as OpenBLAS uses (the launcher sets
// OPENBLAS_NUM_THREADS per rank), so that these kernels use the cores the
// GEMMs use. See docs/performance.md.
#ifndef PIPER_RUNTIME_KERNELS_PARALLEL_H
#define PIPER_RUNTIME_KERNELS_PARALLEL_H

#include <cstdint>
#include <functional>

namespace piper::runtime::detail {

/// Calls body(begin, end) for the chunks [c * grain, min(n, (c + 1) * grain))
/// of [0, n), each exactly once, on up to parallelThreads() threads, the
/// caller included; returns when all are done. The chunks depend on `n` and
/// `grain` only, never on the number of threads, so a body that writes each
/// chunk's own outputs (or a per-chunk partial result, combined in chunk
/// order afterwards) gives the same result on any machine and thread count.
/// Runs on the calling thread alone when there is one chunk, one thread, or
/// when another thread is already running a parallel loop (concurrent
/// streams). `body` must not throw.
void parallelFor(int64_t n, int64_t grain,
                 const std::function<void(int64_t, int64_t)> &body);

/// Threads of parallelFor: openblas_get_num_threads(), at least 1.
int parallelThreads();

} // namespace piper::runtime::detail

#endif // PIPER_RUNTIME_KERNELS_PARALLEL_H
