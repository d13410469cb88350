// The data sources: synthetic sequences (cheap, deterministic, learnable) and
// deterministic windows of a token file.
#include "runtime/exec/Data.h"

#include <string>
#include <vector>

#include "proto/PlanShards.h"
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

int64_t tokenWindowStart(uint64_t seed, int64_t step, int64_t globalMicrobatch,
                         int64_t sequence, int64_t numTokens, int64_t seqLen) {
  uint64_t h = syntheticHash(seed, step, globalMicrobatch, sequence);
  uint64_t starts = static_cast<uint64_t>(numTokens - seqLen);
  // The high half of a 64x64-bit product maps h onto [0, starts) with a
  // bias below starts / 2^64, and no division.
  return static_cast<int64_t>((static_cast<unsigned __int128>(h) * starts) >>
                              64);
}

Status TokenFileData::fill(int64_t step, int64_t globalMicrobatch,
                           int64_t batch, int64_t seqLen, int32_t *tokens,
                           int32_t *targets) {
  int64_t n = file->numTokens();
  if (seqLen < 1 || n < seqLen + 1)
    return Status::error("token file '" + file->path() +
                         "': " + std::to_string(n) +
                         " tokens are too few for a sequence of " +
                         std::to_string(seqLen) + " tokens and its targets");
  for (int64_t j = 0; j < batch; ++j) {
    int64_t start =
        tokenWindowStart(seed, step, globalMicrobatch, j, n, seqLen);
    file->copy(start, seqLen, tokens + j * seqLen);
    file->copy(start + 1, seqLen, targets + j * seqLen);
  }
  return Status::ok();
}

StatusOr<std::unique_ptr<TokenFileData>>
openTokenFileData(const std::string &path, TokenDType dtype, int64_t vocabSize,
                  int64_t seqLen, uint64_t seed) {
  Status status;
  std::shared_ptr<TokenFile> file = TokenFile::open(path, dtype, status);
  if (!file)
    return status;
  if (file->numTokens() < seqLen + 1)
    return Status::error(
        "token file '" + path +
        "': too short: " + std::to_string(file->numTokens()) +
        " tokens, but one sequence of " + std::to_string(seqLen) +
        " tokens and its targets need " + std::to_string(seqLen + 1));
  PIPER_RETURN_IF_ERROR(file->checkVocab(vocabSize));
  return std::make_unique<TokenFileData>(std::move(file), seed);
}

Status fillContextShard(DataSource &data, int64_t step,
                        int64_t globalMicrobatch, int64_t batch, int64_t seqLen,
                        int64_t members, int64_t member, int32_t *tokens,
                        int32_t *targets) {
  if (members <= 1)
    return data.fill(step, globalMicrobatch, batch, seqLen, tokens, targets);
  if (seqLen % (2 * members) != 0 || member < 0 || member >= members)
    return Status::error("context member " + std::to_string(member) + " of " +
                         std::to_string(members) +
                         " cannot split sequences of " +
                         std::to_string(seqLen) + " tokens");
  size_t whole = size_t(batch) * size_t(seqLen);
  std::vector<int32_t> allTokens(whole), allTargets(whole);
  PIPER_RETURN_IF_ERROR(data.fill(step, globalMicrobatch, batch, seqLen,
                                  allTokens.data(), allTargets.data()));
  const int64_t local = seqLen / members;
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t i = 0; i < local; ++i) {
      int64_t from =
          b * seqLen + plan::contextPosition(seqLen, members, member, i);
      tokens[b * local + i] = allTokens[from];
      targets[b * local + i] = allTargets[from];
    }
  return Status::ok();
}

} // namespace piper::runtime
