// The fuzz targets' entry points: each feeds one input, as bytes, through a
// reader (and what runs on its result), the way piperc and piper-run would
// read a file. Built with libFuzzer by scripts/fuzz.sh (clang), and replayed
// over the seed corpus and the crash reproducers by //test/fuzz:replay_test
// (gcc). An entry point must never crash, whatever the bytes: a bad input is
// an error message, which the targets discard.
#ifndef PIPER_TEST_FUZZ_TARGETS_H
#define PIPER_TEST_FUZZ_TARGETS_H

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace piper::fuzz {

/// The outcome of one input: "" when the reader accepted it, else the
/// reader's (first) error message.
using Result = std::string;

/// A plan file: the envelope as given, then, when the bytes start with the
/// magic, again with the header's length and CRC-32 recomputed so that a
/// mutated payload reaches the protobuf parser; a plan that parses goes
/// through validatePlan.
Result fuzzPlan(const uint8_t *data, size_t size);
/// A manifest (protobuf text); one that parses goes through
/// validateStrategy with, for each class, the smallest plan that agrees
/// with it.
Result fuzzManifest(const uint8_t *data, size_t size);
/// A whole safetensors file in memory: the header length, the header JSON,
/// every entry and the tiling of the data section.
Result fuzzSafetensors(const uint8_t *data, size_t size);
/// A strategy file (JSON) through parseStrategy.
Result fuzzStrategy(const uint8_t *data, size_t size);
/// A Hugging Face config.json through gptConfigFromHuggingFace (seq 16,
/// batch 1); an accepted one has its parameters counted.
Result fuzzHfConfig(const uint8_t *data, size_t size);
/// A token file's header and size: the first byte picks the requested
/// dtype (auto, uint16, uint32), the rest is the file.
Result fuzzTokenFile(const uint8_t *data, size_t size);
/// MLIR text through piperc's pre-scan and, when it passes, MLIR's parser,
/// the verifier and the printer (builtin ops, others unregistered); traps
/// when what the scan let through nests deeper than it promises.
Result fuzzMlir(const uint8_t *data, size_t size);

struct Target {
  const char *name; // the folder of its corpus: test/fuzz/corpus/<name>/
  Result (*run)(const uint8_t *data, size_t size);
};

/// Every target, in the order scripts/fuzz.sh runs them.
const std::vector<Target> &targets();

} // namespace piper::fuzz

#endif // PIPER_TEST_FUZZ_TARGETS_H
