// libFuzzer's entry point for one target; scripts/fuzz.sh compiles it once
// per target with -DPIPER_FUZZ_TARGET=fuzzPlan (or another of Targets.h).
#include "test/fuzz/Targets.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  (void)piper::fuzz::PIPER_FUZZ_TARGET(data, size);
  return 0;
}
