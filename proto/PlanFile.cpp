// Plan file and manifest I/O: the versioned, checksummed envelope around Plan.
#include "proto/PlanFile.h"
#include "proto/InputFile.h"

#include <algorithm>
#include <climits>
#include <cstring>
#include <string_view>

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <google/protobuf/text_format.h>
#include <zlib.h>

#include <fmt/format.h>

#include "support/AtomicFile.h"

namespace piper::plan {
namespace {

void putU32(unsigned char *p, uint32_t v) {
  for (int i = 0; i < 4; ++i)
    p[i] = static_cast<unsigned char>(v >> (8 * i));
}

void putU64(unsigned char *p, uint64_t v) {
  for (int i = 0; i < 8; ++i)
    p[i] = static_cast<unsigned char>(v >> (8 * i));
}

uint32_t getU32(const unsigned char *p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i)
    v |= static_cast<uint32_t>(p[i]) << (8 * i);
  return v;
}

uint64_t getU64(const unsigned char *p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i)
    v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return v;
}

std::string unsupportedVersion(const char *what, uint32_t version) {
  return fmt::format("{} schema version {} is not supported (this runtime "
                     "reads version {}); recompile the strategy with a "
                     "matching piperc",
                     what, version, kPlanSchemaVersion);
}

/// Writes `bytes` to a temporary file next to `path`, syncs it and renames it
/// over `path` (AtomicFile), so that a crash or a concurrent reader
/// never sees half a file. Returns "" or the error.
std::string writeAtomically(const std::string &path, std::string_view bytes) {
  AtomicFile file;
  Status status = file.open(path);
  if (status)
    status = file.write(bytes.data(), bytes.size());
  if (status)
    status = file.commit();
  return status ? "" : status.message();
}

std::string planPrefix(const std::string &path) {
  return "plan file '" + path + "': ";
}

std::string manifestPrefix(const std::string &path) {
  return "manifest '" + path + "': ";
}

/// Collects TextFormat parse errors instead of letting protobuf log them.
class CollectErrors : public google::protobuf::io::ErrorCollector {
public:
  void AddError(int line, google::protobuf::io::ColumnNumber column,
                const std::string &message) override {
    if (first.empty())
      first =
          fmt::format("line {}, column {}: {}", line + 1, column + 1, message);
  }
  std::string first;
};

} // namespace

uint32_t crc32(const void *data, size_t size) {
  return static_cast<uint32_t>(
      ::crc32_z(0, static_cast<const Bytef *>(data), size));
}

/// Serializes with map entries in key order, so the same plan always gives
/// the same bytes (reproducible compiles, comparable plan files).
static bool serializeDeterministic(const Plan &plan, std::string *out) {
  out->clear();
  bool ok;
  {
    // The streams trim `out` to the written size when they are destroyed.
    google::protobuf::io::StringOutputStream stream(out);
    google::protobuf::io::CodedOutputStream coded(&stream);
    coded.SetSerializationDeterministic(true);
    ok = plan.SerializeToCodedStream(&coded) && !coded.HadError();
  }
  return ok;
}

std::string writePlanFile(const std::string &path, const Plan &plan) {
  std::string payload;
  if (plan.schema_version() == 0) {
    Plan versioned = plan;
    versioned.set_schema_version(kPlanSchemaVersion);
    if (!serializeDeterministic(versioned, &payload))
      return planPrefix(path) + "cannot serialize the plan";
  } else if (plan.schema_version() != kPlanSchemaVersion) {
    return planPrefix(path) +
           fmt::format("the plan has schema version {} but this writer "
                       "produces version {}",
                       plan.schema_version(), kPlanSchemaVersion);
  } else if (!serializeDeterministic(plan, &payload)) {
    return planPrefix(path) + "cannot serialize the plan";
  }

  std::string bytes(kPlanHeaderSize, '\0');
  auto *h = reinterpret_cast<unsigned char *>(bytes.data());
  std::memcpy(h, kPlanMagic, sizeof(kPlanMagic));
  putU32(h + 8, kPlanSchemaVersion);
  putU64(h + 12, payload.size());
  putU32(h + 20, crc32(payload.data(), payload.size()));
  bytes += payload;

  std::string err = writeAtomically(path, bytes);
  return err.empty() ? "" : planPrefix(path) + err;
}

std::string readPlanFile(const std::string &path, Plan &plan) {
  std::string bytes;
  // The envelope's header and the largest payload protobuf parses.
  std::string err = readInputFile(
      path, bytes, static_cast<int64_t>(kPlanHeaderSize) + INT_MAX);
  if (!err.empty())
    return inputError("plan file", path, err);
  return parsePlanFile(path, bytes, plan);
}

std::string parsePlanFile(const std::string &path, std::string_view bytes,
                          Plan &plan) {
  const auto *h = reinterpret_cast<const unsigned char *>(bytes.data());
  // A short file that starts like a plan is a truncated plan; anything else
  // is not a plan at all.
  size_t magicBytes = std::min(bytes.size(), sizeof(kPlanMagic));
  if (std::memcmp(h, kPlanMagic, magicBytes) != 0)
    return planPrefix(path) + "not a piper plan file";
  if (bytes.size() < kPlanHeaderSize)
    return planPrefix(path) +
           fmt::format("truncated: the file has {} bytes, shorter than the "
                       "{}-byte header",
                       bytes.size(), kPlanHeaderSize);

  uint32_t version = getU32(h + 8);
  if (version != kPlanSchemaVersion)
    return planPrefix(path) + unsupportedVersion("plan", version);

  uint64_t length = getU64(h + 12);
  uint64_t found = bytes.size() - kPlanHeaderSize;
  if (found < length)
    return planPrefix(path) +
           fmt::format("truncated: expected {} payload bytes, found {}", length,
                       found);
  if (found > length)
    return planPrefix(path) +
           fmt::format("corrupted: {} unexpected bytes after the {}-byte "
                       "payload",
                       found - length, length);
  if (length > static_cast<uint64_t>(INT_MAX))
    return planPrefix(path) +
           fmt::format("payload of {} bytes exceeds the 2 GiB protobuf limit",
                       length);

  const char *payload = bytes.data() + kPlanHeaderSize;
  if (crc32(payload, length) != getU32(h + 20))
    return planPrefix(path) + "corrupted: checksum mismatch";

  plan.Clear();
  if (!plan.ParseFromArray(payload, static_cast<int>(length)))
    return planPrefix(path) + "corrupted: the payload is not a valid plan";
  if (plan.schema_version() != version)
    return planPrefix(path) +
           fmt::format("corrupted: the header says schema version {} but the "
                       "plan says {}",
                       version, plan.schema_version());
  // The event count is not backed by data, and the runtime allocates per
  // event: a few bytes must not ask for billions.
  if (plan.num_events() > kMaxPlanEvents)
    return planPrefix(path) +
           fmt::format("corrupted: num_events {} is over the limit of {}",
                       plan.num_events(), kMaxPlanEvents);
  return "";
}

std::string writeManifest(const std::string &path, const Manifest &manifest) {
  Manifest versioned = manifest;
  if (versioned.schema_version() == 0)
    versioned.set_schema_version(kPlanSchemaVersion);
  else if (versioned.schema_version() != kPlanSchemaVersion)
    return manifestPrefix(path) +
           fmt::format("the manifest has schema version {} but this writer "
                       "produces version {}",
                       versioned.schema_version(), kPlanSchemaVersion);
  std::string text;
  if (!google::protobuf::TextFormat::PrintToString(versioned, &text))
    return manifestPrefix(path) + "cannot print the manifest";
  text = "# Piper strategy manifest (piper.plan.Manifest, protobuf text "
         "format).\n" +
         text;
  std::string err = writeAtomically(path, text);
  return err.empty() ? "" : manifestPrefix(path) + err;
}

std::string readManifest(const std::string &path, Manifest &manifest) {
  std::string text;
  std::string err = readInputFile(path, text);
  if (!err.empty())
    return inputError("manifest", path, err);
  return parseManifest(path, text, manifest);
}

std::string parseManifest(const std::string &path, std::string_view text,
                          Manifest &manifest) {
  google::protobuf::TextFormat::Parser parser;
  CollectErrors errors;
  parser.RecordErrorsTo(&errors);
  manifest.Clear();
  if (!parser.ParseFromString(std::string(text), &manifest))
    return manifestPrefix(path) + "not a valid manifest: " +
           (errors.first.empty() ? std::string("parse error") : errors.first);
  if (manifest.schema_version() == 0)
    return manifestPrefix(path) + "missing schema_version";
  if (manifest.schema_version() != kPlanSchemaVersion)
    return manifestPrefix(path) +
           unsupportedVersion("manifest", manifest.schema_version());
  if (manifest.world_size() > kMaxManifestWorldSize)
    return manifestPrefix(path) +
           fmt::format("world_size {} is over the limit of {} devices",
                       manifest.world_size(), kMaxManifestWorldSize);
  return "";
}

} // namespace piper::plan
