// Checkpoint integrity: the CRC-32 of every tensor and the run id recorded in
// a safetensors file's metadata, and the checks that a file's bytes still
// match them and hold finite values (docs/operations.md, "Checkpoint
// integrity").
#ifndef PIPER_RUNTIME_FORMATS_INTEGRITY_H
#define PIPER_RUNTIME_FORMATS_INTEGRITY_H

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "runtime/formats/Safetensors.h"
#include "support/Status.h"

namespace piper::runtime {

/// `__metadata__` keys piper adds to the files it writes: the id of the run
/// that wrote it, and {"<tensor>": "<CRC-32 as 8 hex digits>", ...} of
/// every tensor, as a JSON object in a string (metadata values are
/// strings).
inline constexpr const char *kRunIdKey = "piper.run_id";
inline constexpr const char *kCrc32Key = "piper.crc32";

/// CRC-32 (IEEE 802.3, zlib's crc32_z, as Python's zlib.crc32) of `size`
/// bytes, continuing `crc` (0 to start).
uint32_t crc32Update(uint32_t crc, const void *data, size_t size);
/// "0a1b2c3d": 8 lowercase hex digits.
std::string formatCrc32(uint32_t crc);
/// Parses formatCrc32's form (8 hex digits, either case).
bool parseCrc32(const std::string &text, uint32_t &crc);

/// A fresh run id: 128 bits from std::random_device as 32 lowercase hex
/// digits.
std::string newRunId();
/// Whether `id` has newRunId's form.
bool isRunId(const std::string &id);

/// checkpointMetadata(step), plus kRunIdKey when `runId` is not empty.
SafetensorsMetadata checkpointMetadata(int64_t step, const std::string &runId);

/// Appends kCrc32Key with the CRC-32 of every tensor of `tensors`, computed
/// from their bytes (which must stay unchanged until written), to
/// `metadata`.
void addCrc32s(SafetensorsMetadata &metadata,
               const std::vector<SafetensorsTensor> &tensors);

/// The kCrc32Key value for `crcs` (name, CRC-32), in order.
std::string
crc32Json(const std::vector<std::pair<std::string, uint32_t>> &crcs);

/// The CRC-32s a file records in kCrc32Key, by tensor name; `present` is
/// false (and `out` empty) when it records none. An error when the value is
/// malformed or does not name exactly the file's tensors.
Status recordedCrcs(const SafetensorsReader &reader,
                    std::map<std::string, uint32_t> &out, bool &present);

/// The run id a file records in kRunIdKey, or "" when none; an error when
/// it is not of newRunId's form.
Status recordedRunId(const SafetensorsReader &reader, std::string &runId);

/// What reading every byte of a tensor found.
struct TensorScan {
  uint32_t crc = 0;
  /// The first element that is NaN or infinite (float dtypes), else -1.
  int64_t nonFinite = -1;
  /// "nan", "inf" or "-inf": that element.
  std::string nonFiniteValue;
};

/// Reads tensor `entry` of `reader` in chunks of a few MiB: its CRC-32 and
/// its first non-finite element (F32, F64, F16, BF16).
Status scanTensor(const SafetensorsReader &reader,
                  const SafetensorsEntry &entry, TensorScan &out);

/// The error for tensor `name` of `path` whose bytes give CRC-32 `read`
/// where `recorded` was recorded (in `where`: "state.json", "its
/// metadata").
Status crcMismatch(const std::string &path, const std::string &name,
                   const std::string &where, uint32_t recorded, uint32_t read);

/// Reads every tensor of `reader` and checks that it matches its CRC-32 in
/// `expected` (when not null; `expectedWhere` names it in messages, e.g.
/// "state.json") and the one the file records (when it records any), and,
/// with `finite`, that no floating-point tensor holds a NaN or an infinity.
/// Errors name the file and the tensor: "checkpoint 'F': tensor 'T' does
/// not match its CRC-32 in state.json (recorded 0a1b2c3d, read 5e6f7a8b):
/// the file was corrupted or replaced".
Status verifyTensors(const SafetensorsReader &reader,
                     const std::map<std::string, uint32_t> *expected = nullptr,
                     const std::string &expectedWhere = "", bool finite = true);

} // namespace piper::runtime

#endif // PIPER_RUNTIME_FORMATS_INTEGRITY_H
