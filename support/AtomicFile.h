// Writes a file atomically: a temporary file in the same folder, fsync, rename.
#ifndef PIPER_SUPPORT_ATOMICFILE_H
#define PIPER_SUPPORT_ATOMICFILE_H

#include <cstddef>
#include <string>

#include "support/Errno.h"
#include "support/Status.h"

namespace piper {

/// A file that appears at its path complete or not at all. open() creates
/// `<path>.tmp-XXXXXX` next to `path`; commit() fsyncs it, renames it over
/// `path` and fsyncs the folder. Destroying an uncommitted AtomicFile removes
/// the temporary file, and so do removeTempFiles() (a rank that exits on an
/// error) and the handlers of removeTempFilesOnSignals(). open() refuses a
/// `path` that exists and is not a regular file (a device, a FIFO, a
/// folder): a rename would replace it. Errors name the file.
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
  int tmpSlot = -1;
};

/// Checks, before any work, that a file can later be written atomically at
/// `path`: it is not empty, it is not an existing non-regular file, its
/// folder exists (or can be created) and a file can be created in it. `what`
/// names the option in the error ("--save").
Status checkWritableTarget(const std::string &path, const std::string &what);

/// Creates `dir` (like mkdir -p) and checks that a file can be created in
/// it. `what` starts the error ("--log-dir 'logs'").
Status checkWritableDirectory(const std::string &dir, const std::string &what);

/// Checks that `path` names a regular file without opening it (opening a
/// FIFO blocks; reading /dev/zero never ends). `what` starts the error
/// ("plan file 'x'"); a missing file is "cannot open: no such file...".
Status checkRegularFile(const std::string &path, const std::string &what);

/// Remembers `path` as a file to delete should the process fail before it
/// is complete (a temporary file, a checkpoint part); returns a slot for
/// forgetTempFile, or -1 when every slot is taken.
int rememberTempFile(const std::string &path);
/// Forgets the file of `slot` (committed, merged or removed); -1 is ignored.
void forgetTempFile(int slot);
/// Deletes every remembered file. Async-signal-safe.
void removeTempFiles();
/// Makes SIGTERM, SIGINT and SIGHUP delete the remembered files, then end
/// the process as the signal would have.
void removeTempFilesOnSignals();

/// Creates `dir` and its missing parents (like mkdir -p).
Status makeDirectories(const std::string &dir);

/// fsyncs folder `dir`, making the renames and links in it durable.
Status syncDirectory(const std::string &dir);

/// The folder part of `path` ("." when it has none).
std::string parentDirectory(const std::string &path);

} // namespace piper

#endif // PIPER_SUPPORT_ATOMICFILE_H
