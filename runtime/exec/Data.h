// Training data sources: the deterministic synthetic default, behind an
// interface that a token-file loader can implement later.
#ifndef PIPER_RUNTIME_EXEC_DATA_H
#define PIPER_RUNTIME_EXEC_DATA_H

#include <cstdint>

#include "runtime/support/Status.h"

namespace piper::runtime {

/// Where LOAD_BATCH gets its tokens. A batch is identified by the step and
/// the *global* microbatch index (replica * num_microbatches + microbatch), so
/// every strategy with the same global batch sees the same data.
class DataSource {
public:
  virtual ~DataSource() = default;
  /// Fills `tokens` and `targets`, both int32 row-major [batch, seqLen], with
  /// global microbatch `globalMicrobatch` of 1-based step `step`. Must be
  /// safe to call from several threads at once.
  virtual Status fill(int64_t step, int64_t globalMicrobatch, int64_t batch,
                      int64_t seqLen, int32_t *tokens, int32_t *targets) = 0;
};

/// Synthetic arithmetic sequences: sequence j of global microbatch g of step
/// t starts at h % V and steps by 1 + (h >> 32) % 7 (mod V), where
/// h = syntheticHash(seed, t, g, j). Targets are the tokens shifted by one.
class SyntheticData : public DataSource {
public:
  SyntheticData(uint64_t seed, int64_t vocabSize)
      : seed(seed), vocabSize(vocabSize) {}
  Status fill(int64_t step, int64_t globalMicrobatch, int64_t batch,
              int64_t seqLen, int32_t *tokens, int32_t *targets) override;

private:
  uint64_t seed;
  int64_t vocabSize;
};

/// h = mix64 chain over (seed, step, global microbatch, sequence); see
/// docs/plan-format.md for the exact definition.
uint64_t syntheticHash(uint64_t seed, int64_t step, int64_t globalMicrobatch,
                       int64_t sequence);

} // namespace piper::runtime

#endif // PIPER_RUNTIME_EXEC_DATA_H
