// Atomic file writing (temp file, fsync, rename) and small path helpers.
#include "support/AtomicFile.h"
#include "support/FileIO.h"
#include "support/RegularFile.h"

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace piper {

namespace {

/// The remembered files: a fixed table, so that a signal handler can walk it
/// without locks or allocation.
constexpr int kTempSlots = 64;
constexpr size_t kTempPathMax = 4096;
struct TempSlot {
  std::atomic<int> state{0}; // 0 free, 1 being written, 2 set
  char path[kTempPathMax];
};
TempSlot tempSlots[kTempSlots];

void onCleanupSignal(int sig) {
  removeTempFiles();
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

} // namespace

int rememberTempFile(const std::string &path) {
  if (path.size() >= kTempPathMax)
    return -1;
  for (int i = 0; i < kTempSlots; ++i) {
    int expected = 0;
    if (!tempSlots[i].state.compare_exchange_strong(expected, 1))
      continue;
    std::memcpy(tempSlots[i].path, path.c_str(), path.size() + 1);
    tempSlots[i].state.store(2);
    return i;
  }
  return -1;
}

void forgetTempFile(int slot) {
  if (slot >= 0 && slot < kTempSlots)
    tempSlots[slot].state.store(0);
}

void removeTempFiles() {
  for (TempSlot &slot : tempSlots) {
    int expected = 2;
    if (slot.state.compare_exchange_strong(expected, 1)) {
      ::unlink(slot.path);
      slot.state.store(0);
    }
  }
}

void removeTempFilesOnSignals() {
  struct sigaction sa;
  std::memset(&sa, 0, sizeof(sa));
  sa.sa_handler = onCleanupSignal;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGTERM, SIGINT, SIGHUP})
    ::sigaction(sig, &sa, nullptr);
}

Status checkRegularFile(const std::string &path, const std::string &what) {
  if (std::string problem = regularFileProblem(path); !problem.empty())
    return Status::error(what + ": " + problem);
  return Status::ok();
}

Status checkWritableTarget(const std::string &path, const std::string &what) {
  if (path.empty())
    return Status::error(what + " needs a file name, not ''");
  struct stat st;
  if (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode))
    return Status::error(what + " '" + path + "': " +
                         (S_ISDIR(st.st_mode)
                              ? "is a directory"
                              : "exists and is not a regular file (a "
                                "device or a FIFO?); refusing to replace it"));
  return checkWritableDirectory(parentDirectory(path),
                                what + " '" + path + "'");
}

Status checkWritableDirectory(const std::string &dir, const std::string &what) {
  Status made = makeDirectories(dir);
  if (!made)
    return Status::error(what + ": " + made.message());
  // Creating a file is the only reliable test: access() says yes to root on
  // a read-only file system.
  std::string probe = dir + "/.piper-probe-XXXXXX";
  int fd = ::mkostemp(probe.data(), O_CLOEXEC);
  if (fd < 0)
    return Status::error(what + ": cannot create a file in '" + dir +
                         "': " + errnoMessage(errno));
  ::close(fd);
  ::unlink(probe.c_str());
  return Status::ok();
}

std::string parentDirectory(const std::string &path) {
  size_t slash = path.find_last_of('/');
  if (slash == std::string::npos)
    return ".";
  if (slash == 0)
    return "/";
  return path.substr(0, slash);
}

Status makeDirectories(const std::string &dir) {
  for (size_t pos = 1; pos <= dir.size(); ++pos) {
    if (pos != dir.size() && dir[pos] != '/')
      continue;
    std::string prefix = dir.substr(0, pos);
    if (::mkdir(prefix.c_str(), 0755) == 0 || errno == EEXIST)
      continue;
    return Status::error("cannot create directory '" + prefix +
                         "': " + errnoMessage(errno));
  }
  struct stat st;
  if (!dir.empty() && (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)))
    return Status::error("'" + dir + "' is not a directory");
  return Status::ok();
}

AtomicFile::~AtomicFile() { discard(); }

void AtomicFile::discard() {
  if (fd >= 0)
    ::close(fd);
  fd = -1;
  if (!tmpPath.empty())
    ::unlink(tmpPath.c_str());
  tmpPath.clear();
  forgetTempFile(tmpSlot);
  tmpSlot = -1;
}

Status AtomicFile::open(const std::string &target) {
  discard();
  path = target;
  // rename(2) would replace a device node or a FIFO with a regular file.
  struct stat existing;
  if (::stat(target.c_str(), &existing) == 0 && !S_ISREG(existing.st_mode))
    return Status::error("'" + path + "' " +
                         (S_ISDIR(existing.st_mode)
                              ? std::string("is a directory")
                              : std::string("exists and is not a regular file "
                                            "(a device or a FIFO?); refusing "
                                            "to replace it")));
  std::vector<char> name(target.begin(), target.end());
  const char suffix[] = ".tmp-XXXXXX";
  name.insert(name.end(), suffix, suffix + sizeof(suffix)); // with the NUL
  int created = ::mkostemp(name.data(), O_CLOEXEC);
  if (created < 0)
    return Status::error("cannot create a temporary file next to '" + path +
                         "': " + errnoMessage(errno));
  fd = created;
  tmpPath = name.data();
  tmpSlot = rememberTempFile(tmpPath);
  // mkstemp creates 0600; a data or checkpoint file is for everyone to read.
  // (umask() cannot be read without changing it, which is not thread-safe.)
  ::fchmod(fd, 0644);
  return Status::ok();
}

Status AtomicFile::write(const void *data, size_t bytes) {
  if (fd < 0)
    return Status::error("'" + path + "' is not open for writing");
  if (!writeAll(fd, data, bytes)) {
    Status st =
        Status::error("cannot write '" + tmpPath + "': " + errnoMessage(errno));
    discard();
    return st;
  }
  return Status::ok();
}

Status AtomicFile::commit() {
  if (fd < 0)
    return Status::error("'" + path + "' is not open for writing");
  if (::fsync(fd) != 0) {
    Status st =
        Status::error("cannot fsync '" + tmpPath + "': " + errnoMessage(errno));
    discard();
    return st;
  }
  int closed = ::close(fd);
  fd = -1;
  if (closed != 0) {
    Status st =
        Status::error("cannot close '" + tmpPath + "': " + errnoMessage(errno));
    discard();
    return st;
  }
  if (::rename(tmpPath.c_str(), path.c_str()) != 0) {
    Status st = Status::error("cannot rename '" + tmpPath + "' to '" + path +
                              "': " + errnoMessage(errno));
    discard();
    return st;
  }
  tmpPath.clear();
  forgetTempFile(tmpSlot);
  tmpSlot = -1;
  // Make the rename itself durable; failing to open the folder is harmless.
  (void)syncDirectory(parentDirectory(path));
  return Status::ok();
}

Status syncDirectory(const std::string &dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0)
    return Status::error("cannot open '" + dir + "': " + errnoMessage(errno));
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  if (rc != 0)
    return Status::error("cannot sync '" + dir + "': " + errnoMessage(err));
  return Status::ok();
}

} // namespace piper
