// The fuzz targets' entry points (Targets.h).
#include "test/fuzz/Targets.h"

#include <cstring>
#include <string_view>

#include <google/protobuf/stubs/logging.h>

#include "compiler/frontend/HfConfig.h"
#include "compiler/strategy/Strategy.h"
#include "proto/PlanFile.h"
#include "runtime/data/TokenFile.h"
#include "runtime/exec/Validate.h"
#include "runtime/formats/Safetensors.h"

namespace piper::fuzz {
namespace {

std::string_view view(const uint8_t *data, size_t size) {
  return {reinterpret_cast<const char *>(data), size};
}

void putLE(std::string &bytes, size_t at, uint64_t v, int n) {
  for (int i = 0; i < n; ++i)
    bytes[at + i] = static_cast<char>((v >> (8 * i)) & 0xFF);
}

} // namespace

Result fuzzPlan(const uint8_t *data, size_t size) {
  // Protobuf logs invalid UTF-8 in string fields to stderr before the parse
  // fails; the failure is what counts.
  static const bool quiet = (google::protobuf::SetLogHandler(nullptr), true);
  (void)quiet;
  std::string bytes(view(data, size));
  plan::Plan p;
  std::string err = plan::parsePlanFile("fuzz.plan", bytes, p);
  if (bytes.size() >= plan::kPlanHeaderSize &&
      std::memcmp(bytes.data(), plan::kPlanMagic, sizeof(plan::kPlanMagic)) ==
          0) {
    // Make the envelope agree with the payload, so that the fuzzer explores
    // the payload instead of the checksum.
    uint64_t length = bytes.size() - plan::kPlanHeaderSize;
    putLE(bytes, 12, length, 8);
    putLE(bytes, 20, plan::crc32(bytes.data() + plan::kPlanHeaderSize, length),
          4);
    err = plan::parsePlanFile("fuzz.plan", bytes, p);
  }
  if (!err.empty())
    return err;
  Status st = runtime::validatePlan(p);
  return st ? "" : st.message();
}

Result fuzzManifest(const uint8_t *data, size_t size) {
  plan::Manifest m;
  std::string err = plan::parseManifest("fuzz.textproto", view(data, size), m);
  if (!err.empty())
    return err;
  std::vector<plan::Plan> plans;
  for (const plan::Manifest::Class &cls : m.classes()) {
    plan::Plan &p = plans.emplace_back();
    p.set_schema_version(plan::kPlanSchemaVersion);
    p.set_device_class(cls.device_class());
    p.set_world_size(m.world_size());
    *p.mutable_ranks() = cls.ranks();
    // validateStrategy assumes plans that passed validatePlan.
    if (!runtime::validatePlan(p))
      return "a class's plan is invalid";
  }
  Status st = runtime::validateStrategy(m, plans);
  return st ? "" : st.message();
}

Result fuzzSafetensors(const uint8_t *data, size_t size) {
  std::vector<runtime::SafetensorsEntry> entries;
  runtime::SafetensorsMetadata meta;
  Status st = runtime::parseSafetensors("fuzz.safetensors", view(data, size),
                                        entries, meta);
  return st ? "" : st.message();
}

Result fuzzStrategy(const uint8_t *data, size_t size) {
  llvm::Expected<mlir::piper::Strategy> s = mlir::piper::parseStrategy(
      llvm::StringRef(reinterpret_cast<const char *>(data), size));
  if (!s)
    return llvm::toString(s.takeError());
  // What piperc does next with a parsed strategy, short of a model.
  (void)mlir::piper::numStages(*s);
  for (const mlir::piper::Directive &d : s->directives)
    (void)d.describe();
  return "";
}

Result fuzzHfConfig(const uint8_t *data, size_t size) {
  mlir::piper::GptConfig cfg;
  std::string err = mlir::piper::gptConfigFromHuggingFace(
      llvm::StringRef(reinterpret_cast<const char *>(data), size),
      "config.json", /*seq=*/16, /*batch=*/1, cfg);
  if (!err.empty())
    return err;
  // What piperc does next with an accepted configuration, short of
  // building the model: its sizes.
  (void)mlir::piper::countParameters(cfg);
  (void)cfg.capacity();
  return "";
}

Result fuzzTokenFile(const uint8_t *data, size_t size) {
  if (size == 0)
    return "empty input";
  runtime::TokenDType dtype = data[0] % 3 == 0   ? runtime::TokenDType::Auto
                              : data[0] % 3 == 1 ? runtime::TokenDType::U16
                                                 : runtime::TokenDType::U32;
  std::string file(view(data + 1, size - 1));
  runtime::TokenFileLayout layout;
  Status st = runtime::parseTokenFileLayout(
      "fuzz.tokens", reinterpret_cast<const unsigned char *>(file.data()),
      static_cast<int64_t>(file.size()), dtype, layout);
  if (!st)
    return st.message();
  // The layout must describe bytes that exist.
  int64_t width = runtime::tokenWidth(layout.dtype);
  if (layout.dataOffset + layout.numTokens * width !=
      static_cast<int64_t>(file.size()))
    __builtin_trap();
  return "";
}

const std::vector<Target> &targets() {
  static const std::vector<Target> all = {
      {"plan", fuzzPlan},
      {"manifest", fuzzManifest},
      {"safetensors", fuzzSafetensors},
      {"strategy", fuzzStrategy},
      {"hfconfig", fuzzHfConfig},
      {"tokenfile", fuzzTokenFile},
      {"mlir", fuzzMlir},
  };
  return all;
}

} // namespace piper::fuzz
