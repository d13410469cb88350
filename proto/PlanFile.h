// Reading and writing plan files and the strategy manifest, shared by the
// compiler (which writes them) and the runtime (which reads them).
#ifndef PIPER_PROTO_PLANFILE_H
#define PIPER_PROTO_PLANFILE_H

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "proto/plan.pb.h"

namespace piper::plan {

/// The only plan schema version this build reads and writes. Bump it on any
/// change that an older runtime would misread.
constexpr uint32_t kPlanSchemaVersion = 2;

/// The eight magic bytes that open every plan file.
constexpr char kPlanMagic[8] = {'P', 'I', 'P', 'R', 'P', 'L', 'A', 'N'};

/// Size of the fixed header in front of the serialized Plan.
constexpr size_t kPlanHeaderSize = 24;

/// The largest world size a manifest may declare: piperc's limit
/// (mlir::piper::kMaxWorldSize, docs/user-guide.md "Limits"). The runtime
/// allocates per rank of the world before it looks at a single plan.
constexpr int32_t kMaxManifestWorldSize = 1 << 20;

/// The most events a plan may declare (each is one RECORD instruction of a
/// step; the runtime allocates per event before it runs).
constexpr int32_t kMaxPlanEvents = 1 << 24;

/// File name of the manifest inside a compiled strategy folder.
constexpr const char *kManifestFileName = "manifest.textproto";

/// CRC-32 (IEEE 802.3, reflected polynomial 0xEDB88320) of `size` bytes:
/// zlib's crc32_z(), which the file format has always used.
uint32_t crc32(const void *data, size_t size);

/// Writes `plan` to `path` (header + payload) atomically: a reader sees either
/// the old file or the complete new one. A plan whose schema_version is 0 is
/// written with kPlanSchemaVersion; any other mismatch is an error.
/// Returns "" on success, else an error message naming the file.
std::string writePlanFile(const std::string &path, const Plan &plan);

/// Reads and checks the plan file at `path` into `plan`: magic, schema version,
/// length and checksum, and that num_events is at most kMaxPlanEvents. Returns
/// "" on success, else an error message naming the file.
std::string readPlanFile(const std::string &path, Plan &plan);

/// readPlanFile on the file's `bytes`, already in memory; `path` only names
/// the file in messages.
std::string parsePlanFile(const std::string &path, std::string_view bytes,
                          Plan &plan);

/// Writes `manifest` as protobuf text to `path` (normally
/// OUT/manifest.textproto), atomically; schema_version 0 is written as
/// kPlanSchemaVersion. Returns "" on success, else an error message.
std::string writeManifest(const std::string &path, const Manifest &manifest);

/// Parses the manifest text at `path` and checks its schema version and that
/// its world_size is at most kMaxManifestWorldSize.
/// Returns "" on success, else an error message naming the file.
std::string readManifest(const std::string &path, Manifest &manifest);

/// readManifest on the manifest's `text`, already in memory; `path` only
/// names the file in messages.
std::string parseManifest(const std::string &path, std::string_view text,
                          Manifest &manifest);

} // namespace piper::plan

#endif // PIPER_PROTO_PLANFILE_H
