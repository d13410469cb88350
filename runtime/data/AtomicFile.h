// Writes a file atomically: a temporary file in the same folder, fsync, rename.
#ifndef PIPER_RUNTIME_DATA_ATOMICFILE_H
#define PIPER_RUNTIME_DATA_ATOMICFILE_H

#include <cstddef>
#include <string>

#include "runtime/support/Status.h"

namespace piper::runtime {

/// A file that appears at its path complete or not at all. open() creates
/// `<path>.tmp-XXXXXX` next to `path`; commit() fsyncs it, renames it over
/// `path` and fsyncs the folder. Destroying an uncommitted AtomicFile removes
/// the temporary file. Errors name the file.
class AtomicFile {
public:
  AtomicFile() = default;
  AtomicFile(const AtomicFile &) = delete;
  AtomicFile &operator=(const AtomicFile &) = delete;
  ~AtomicFile();

  /// Creates the temporary file (mode 0644) for `path`.
  Status open(const std::string &path);
  /// Appends `bytes` bytes at `data`.
  Status write(const void *data, size_t bytes);
  /// Makes the written bytes the content of `path`.
  Status commit();

private:
  void discard();
  std::string path;
  std::string tmpPath;
  int fd = -1;
};

/// strerror() text, lowercased (runtime messages are lowercase).
std::string errnoMessage(int err);

/// Creates `dir` and its missing parents (like mkdir -p).
Status makeDirectories(const std::string &dir);

/// The folder part of `path` ("." when it has none).
std::string parentDirectory(const std::string &path);

} // namespace piper::runtime

#endif // PIPER_RUNTIME_DATA_ATOMICFILE_H
