// Reading, writing and merging safetensors files, and matching a checkpoint
// against a model's parameters.
#ifndef PIPER_RUNTIME_FORMATS_SAFETENSORS_H
#define PIPER_RUNTIME_FORMATS_SAFETENSORS_H

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "support/Status.h"

namespace piper::runtime {

/// The safetensors limit on the JSON header (and ours).
constexpr uint64_t kSafetensorsMaxHeaderBytes = 100'000'000;

/// `__metadata__`: string keys to string values, in order.
using SafetensorsMetadata = std::vector<std::pair<std::string, std::string>>;

/// Bytes per element of a safetensors dtype ("F32" -> 4), 0 if unknown.
int safetensorsDTypeSize(const std::string &dtype);

/// "[2, 3]" for messages.
std::string formatShape(const std::vector<int64_t> &shape);

/// One tensor of a file's header.
struct SafetensorsEntry {
  std::string name;
  std::string dtype; // "F32", "BF16", ...
  std::vector<int64_t> shape;
  uint64_t begin = 0; // data_offsets, relative to the end of the header
  uint64_t end = 0;
};

/// A tensor to write: `dtype`, `shape` and the host bytes at `data`
/// (numel * dtype size of them).
struct SafetensorsTensor {
  std::string name;
  std::string dtype = "F32";
  std::vector<int64_t> shape;
  const void *data = nullptr;
};

/// The header of a file holding `tensors` in order, without gaps: 8-byte
/// little-endian length N, then N bytes of JSON (`__metadata__` first when
/// not empty) padded with spaces to a multiple of 8.
std::string safetensorsHeader(const std::vector<SafetensorsEntry> &tensors,
                              const SafetensorsMetadata &metadata);

/// Writes `tensors` to `path` atomically (temporary file, fsync, rename).
/// Names must be unique, non-empty and not "__metadata__".
Status writeSafetensors(const std::string &path,
                        const std::vector<SafetensorsTensor> &tensors,
                        const SafetensorsMetadata &metadata);

/// An open safetensors file whose header has been validated: every tensor
/// has a known dtype, a non-negative shape and offsets that match its size,
/// and the tensors tile the data section exactly (no overlap, no gap, no
/// trailing bytes), as the reference implementation demands.
class SafetensorsReader {
public:
  /// Opens `path`. Errors start with "checkpoint '<path>': ".
  static std::unique_ptr<SafetensorsReader> open(const std::string &path,
                                                 Status &status);
  ~SafetensorsReader();
  SafetensorsReader(const SafetensorsReader &) = delete;
  SafetensorsReader &operator=(const SafetensorsReader &) = delete;

  const std::string &path() const { return filePath; }
  /// In header order.
  const std::vector<SafetensorsEntry> &tensors() const { return entries; }
  const SafetensorsMetadata &metadata() const { return meta; }
  /// The metadata value of `key`, or null.
  const std::string *metadataValue(const std::string &key) const;
  /// The tensor named `name`, or null.
  const SafetensorsEntry *find(const std::string &name) const;
  /// Reads the `entry.end - entry.begin` data bytes of `entry` into `out`.
  Status read(const SafetensorsEntry &entry, void *out) const;
  /// Reads `size` bytes of `entry`'s data from byte `offset` of it (within
  /// its data) into `out`.
  Status readRange(const SafetensorsEntry &entry, uint64_t offset, size_t size,
                   void *out) const;
  /// The CRC-32 of the file's first 8 + N bytes (the header length and the
  /// header): with every tensor's CRC-32 it covers every byte of the file.
  uint32_t headerCrc32() const { return headerCrc; }
  /// The file's size in bytes.
  uint64_t fileSize() const { return size; }

private:
  SafetensorsReader() = default;
  std::string filePath;
  int fd = -1;
  uint64_t dataStart = 0; // 8 + N
  uint64_t size = 0;
  uint32_t headerCrc = 0;
  std::vector<SafetensorsEntry> entries;
  SafetensorsMetadata meta;
};

/// The checks of SafetensorsReader::open on a whole file held in memory:
/// fills `entries` (header order) and `metadata`. `path` only names the file
/// in messages, which are those open() gives.
Status parseSafetensors(const std::string &path, std::string_view bytes,
                        std::vector<SafetensorsEntry> &entries,
                        SafetensorsMetadata &metadata);

/// Writes the tensors of `parts` (in order: each part's tensors in its
/// header order) into one file at `path`, atomically, with `metadata`. A
/// name held by several parts must have the same dtype, shape and bytes in
/// each (a tied or replicated parameter) and is written once. A part's
/// tensors must match the CRC-32s it records (piper.crc32, Integrity.h);
/// when every part records them, so does the merged file.
Status mergeSafetensors(const std::vector<std::string> &parts,
                        const std::string &path,
                        const SafetensorsMetadata &metadata);

/// A parameter a checkpoint must provide: fp32 of `shape`.
struct ParamSpec {
  std::string name;
  std::vector<int64_t> shape;
};

/// Checks that `reader` holds every parameter of `params` as F32 with its
/// shape and, when `rejectExtra`, nothing else. One error lists every
/// problem: missing parameters, wrong dtypes or shapes, unexpected tensors.
Status checkCheckpointParams(const SafetensorsReader &reader,
                             const std::vector<ParamSpec> &params,
                             bool rejectExtra);

/// Piper's checkpoint metadata: {"format": "pt", "producer": "piper",
/// "step": "<step>"}.
SafetensorsMetadata checkpointMetadata(int64_t step);

/// The "step" of a checkpoint's metadata: 0 when absent, an error when it is
/// not a non-negative integer.
Status checkpointStep(const SafetensorsReader &reader, int64_t &step);

} // namespace piper::runtime

#endif // PIPER_RUNTIME_FORMATS_SAFETENSORS_H
