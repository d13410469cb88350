// The one reader of input files that every Piper tool uses (models,
// strategies, manifests, plans, machine descriptions): it refuses what it
// cannot bound instead of hanging or running out of memory. Shared by the
// compiler and the runtime, so it depends on nothing but the C library (and
// support/'s errnoMessage).
#ifndef PIPER_PROTO_INPUTFILE_H
#define PIPER_PROTO_INPUTFILE_H

#include <cstdint>
#include <string>

namespace piper {

/// The most bytes a tool reads from one text input (a model, a strategy, a
/// manifest, a machine description). Real ones are far smaller: a
/// llama-1b model is under 100 KB of MLIR, and MLIR needs many times its
/// text in memory to parse it.
inline constexpr int64_t kMaxInputBytes = int64_t(256) << 20; // 256 MiB

/// The most bytes of a Hugging Face config.json that piperc and piper-run
/// read: real ones are a few KB (a few hundred keys at most).
inline constexpr int64_t kMaxHfConfigBytes = int64_t(16) << 20; // 16 MiB

/// Checks, without opening it, that `path` may be read: a regular file or
/// "-" (standard input). A FIFO is refused because opening one blocks until
/// a writer comes, a device such as /dev/zero because it never ends, a
/// folder because it is not a file. Returns "" or the reason, without the
/// path ("is not a regular file"); a missing file is "cannot open: ...".
std::string checkInputPath(const std::string &path);

/// Reads the whole input `path` into `out`: a regular file, or standard
/// input when `path` is "-" (a pipe or a terminal, read until its end). An
/// input of more than `limit` bytes is refused without reading past the
/// limit. Returns "" or the reason, without the path ("is more than N
/// bytes (the limit)", "cannot read: ...").
std::string readInputFile(const std::string &path, std::string &out,
                          int64_t limit = kMaxInputBytes);

/// The error for input `path`, a `what`, refused for `reason` (from
/// checkInputPath, readInputFile, or a check of the content that reads as a
/// predicate, "nests ..."): "model 'gpt.mlir' is not a regular file",
/// "strategy file 's.json': cannot open: no such file or directory", "model
/// on standard input is more than the limit of N bytes".
std::string inputError(const std::string &what, const std::string &path,
                       const std::string &reason);

} // namespace piper

#endif // PIPER_PROTO_INPUTFILE_H
