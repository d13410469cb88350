// Training data sources behind one interface: the deterministic synthetic
// default and windows sampled from a memory-mapped token file.
#ifndef PIPER_RUNTIME_EXEC_DATA_H
#define PIPER_RUNTIME_EXEC_DATA_H

#include <cstdint>
#include <memory>
#include <string>

#include "runtime/data/TokenFile.h"
#include "support/Status.h"

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

/// Windows of a token file: sequence j of global microbatch g of step t is
/// the S + 1 tokens starting at tokenWindowStart(seed, t, g, j, N, S) of the
/// file's N tokens; tokens are the first S, targets the last S. Shares the
/// file (and its mapping) with other sources.
class TokenFileData : public DataSource {
public:
  TokenFileData(std::shared_ptr<const TokenFile> file, uint64_t seed)
      : file(std::move(file)), seed(seed) {}
  Status fill(int64_t step, int64_t globalMicrobatch, int64_t batch,
              int64_t seqLen, int32_t *tokens, int32_t *targets) override;
  const TokenFile &tokenFile() const { return *file; }

private:
  std::shared_ptr<const TokenFile> file;
  uint64_t seed;
};

/// Fills `tokens` and `targets`, int32 [batch, seqLen / members], with
/// context member `member`'s part of global microbatch `globalMicrobatch`:
/// the whole sequences from `data`, then of each the two chunks the member
/// holds (plan::contextPosition: chunks m and 2N-1-m of 2N). With one member
/// the whole sequences. seqLen must be a multiple of 2 x members when
/// members > 1.
Status fillContextShard(DataSource &data, int64_t step,
                        int64_t globalMicrobatch, int64_t batch, int64_t seqLen,
                        int64_t members, int64_t member, int32_t *tokens,
                        int32_t *targets);

/// Opens `path` as training data for a model with `vocabSize` tokens and
/// sequences of `seqLen`: maps it (see TokenFile::open for `dtype`), checks
/// every token against the vocabulary and that it holds at least
/// seqLen + 1 tokens.
StatusOr<std::unique_ptr<TokenFileData>>
openTokenFileData(const std::string &path, TokenDType dtype, int64_t vocabSize,
                  int64_t seqLen, uint64_t seed);

/// The first token of a window of seqLen + 1 tokens in a file of
/// `numTokens`: floor(h * (numTokens - seqLen) / 2^64) with
/// h = syntheticHash(seed, step, globalMicrobatch, sequence), uniform over
/// [0, numTokens - seqLen - 1]. Requires numTokens > seqLen >= 0.
int64_t tokenWindowStart(uint64_t seed, int64_t step, int64_t globalMicrobatch,
                         int64_t sequence, int64_t numTokens, int64_t seqLen);

/// h = mix64 chain over (seed, step, global microbatch, sequence); see
/// docs/plan-format.md for the exact definition.
uint64_t syntheticHash(uint64_t seed, int64_t step, int64_t globalMicrobatch,
                       int64_t sequence);

} // namespace piper::runtime

#endif // PIPER_RUNTIME_EXEC_DATA_H
