// The manifest of a checkpoint directory (state.json, written last): the
// step, the run that wrote it, and every file with its size and CRC-32s;
// its type-checked parsing, and the verification of a directory against it.
#ifndef PIPER_RUNTIME_FORMATS_CHECKPOINTMANIFEST_H
#define PIPER_RUNTIME_FORMATS_CHECKPOINTMANIFEST_H

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "runtime/formats/Json.h"
#include "runtime/formats/Safetensors.h"
#include "support/Status.h"

namespace piper::runtime {

/// state.json's "format".
inline constexpr const char *kCheckpointFormat = "piper-checkpoint";
/// state.json's "version": 1 whole checkpoints, 2 the sharded layout, 3 run
/// ids and CRC-32s (both layouts).
inline constexpr int kCheckpointVersion = 3;

/// One file of a checkpoint, as its manifest records it.
struct ManifestFile {
  /// A plain file name in the checkpoint's directory.
  std::string name;
  uint64_t bytes = 0;
  /// Version 3 on: the CRC-32 of the header (SafetensorsReader::
  /// headerCrc32) and of every tensor, in the file's order.
  uint32_t headerCrc = 0;
  std::vector<std::pair<std::string, uint32_t>> tensors;
};

/// What state.json says.
struct CheckpointManifest {
  int64_t version = kCheckpointVersion;
  int64_t step = 0;
  /// "whole" (model and optimizer files) or "shards" (rank-R files).
  std::string layout = "whole";
  /// Version 3 on: the run that wrote it (Integrity.h's newRunId form).
  std::string runId;
  /// The options that make a run's continuation the same (seed, data,
  /// global batch...); compared by the launcher. Null when absent.
  Json run;
  std::vector<ManifestFile> files;

  /// Whether files carry run ids and CRC-32s to check (version 3 on).
  bool checksummed() const { return version >= 3; }
};

/// Parses state.json's `text`, checking the type of every field. Errors
/// name the field ("\"format\" is a number, expected a string"). A version
/// newer than kCheckpointVersion is an error ("written by a newer piper").
Status parseCheckpointManifest(const std::string &text,
                               CheckpointManifest &out);

/// state.json's text for `manifest` (indented, a final newline).
std::string formatCheckpointManifest(const CheckpointManifest &manifest);

/// Describes the file `dir`/`name`, just written by run `runId` after step
/// `step`, for the manifest: its size, its header's CRC-32 and the CRC-32s
/// its metadata records, which it must have, with that run id and step.
/// Reads the header only.
Status describeCheckpointFile(const std::string &dir, const std::string &name,
                              const std::string &runId, int64_t step,
                              ManifestFile &out);

/// How a checkpoint directory failed verification.
enum class CheckpointFault {
  None,
  /// Not completely written: a file of the manifest is missing or not of
  /// the size written (a cut-off copy or write), or (before version 3) does
  /// not open. An older checkpoint may be used instead.
  Incomplete,
  /// Complete, but its bytes are not what was written: a header or tensor
  /// that does not match its CRC-32, a file of another run or step, a
  /// tensor the manifest does not list, a NaN or infinity. Never used
  /// unless the user asks (--resume-fallback).
  Corrupt,
};

/// Opens every file of `manifest` in `dir` and checks it: its size, then a
/// valid header of the recorded CRC-32 with the manifest's run id and step,
/// exactly the manifest's tensors, each of its recorded CRC-32, and no
/// NaN or infinity in any floating-point tensor. Before version 3 only the
/// size (when recorded), the header, the step and the values are checked.
/// Reads every byte once. `readers` gets the open files in manifest order;
/// on an error `fault` says which kind, and the message names the file and
/// tensor.
Status
verifyCheckpointDir(const std::string &dir, const CheckpointManifest &manifest,
                    std::vector<std::unique_ptr<SafetensorsReader>> &readers,
                    CheckpointFault &fault);

} // namespace piper::runtime

#endif // PIPER_RUNTIME_FORMATS_CHECKPOINTMANIFEST_H
