// The synthetic data source: cheap, deterministic and learnable sequences.
#include "runtime/exec/Data.h"

#include <string>

#include "runtime/exec/Init.h"

namespace piper::runtime {

namespace {
constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;
} // namespace

uint64_t syntheticHash(uint64_t seed, int64_t step, int64_t globalMicrobatch,
                       int64_t sequence) {
  // Adding the golden ratio before each mix keeps a zero input from mapping
  // to zero, as in SplitMix64.
  uint64_t h = mix64(seed + kGolden);
  h = mix64((h ^ static_cast<uint64_t>(step)) + kGolden);
  h = mix64((h ^ static_cast<uint64_t>(globalMicrobatch)) + kGolden);
  h = mix64((h ^ static_cast<uint64_t>(sequence)) + kGolden);
  return h;
}

Status SyntheticData::fill(int64_t step, int64_t globalMicrobatch,
                           int64_t batch, int64_t seqLen, int32_t *tokens,
                           int32_t *targets) {
  if (vocabSize < 1 || vocabSize > INT32_MAX)
    return Status::error("synthetic data: vocab_size " +
                         std::to_string(vocabSize) + " is out of range");
  uint64_t v = static_cast<uint64_t>(vocabSize);
  for (int64_t j = 0; j < batch; ++j) {
    uint64_t h = syntheticHash(seed, step, globalMicrobatch, j);
    uint64_t start = h % v;
    uint64_t stride = 1 + (h >> 32) % 7;
    int32_t *tok = tokens + j * seqLen;
    int32_t *tgt = targets + j * seqLen;
    for (int64_t i = 0; i < seqLen; ++i) {
      uint64_t ui = static_cast<uint64_t>(i);
      tok[i] = static_cast<int32_t>((start + ui * stride) % v);
      tgt[i] = static_cast<int32_t>((start + (ui + 1) * stride) % v);
    }
  }
  return Status::ok();
}

} // namespace piper::runtime
