// The one check that a path names a regular file, made before any reader
// opens an input (models, strategies, plans, manifests, checkpoints, token
// files): a FIFO would block the reader until a writer came, a device may
// never end, a folder cannot be read. proto/'s input reader, the runtime's
// checkRegularFile and the Hugging Face checkpoint reader all ask it.
#ifndef PIPER_SUPPORT_REGULARFILE_H
#define PIPER_SUPPORT_REGULARFILE_H

#include <string>

namespace piper {

/// "" when `path` names a regular file (links followed); otherwise what it
/// is instead: "cannot open: <why>" (missing, no permission), "is a
/// directory" or "is not a regular file" (a FIFO, a device, a socket).
std::string regularFileProblem(const std::string &path);

/// Whether `path` names a regular file.
inline bool isRegularFile(const std::string &path) {
  return regularFileProblem(path).empty();
}

} // namespace piper

#endif // PIPER_SUPPORT_REGULARFILE_H
