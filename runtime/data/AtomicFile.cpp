// Atomic file writing (temp file, fsync, rename) and small path helpers.
#include "runtime/data/AtomicFile.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace piper::runtime {

std::string errnoMessage(int err) {
  std::string s = std::strerror(err);
  if (!s.empty() && s[0] >= 'A' && s[0] <= 'Z')
    s[0] = static_cast<char>(s[0] - 'A' + 'a');
  return s;
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
}

Status AtomicFile::open(const std::string &target) {
  discard();
  path = target;
  std::vector<char> name(target.begin(), target.end());
  const char suffix[] = ".tmp-XXXXXX";
  name.insert(name.end(), suffix, suffix + sizeof(suffix)); // with the NUL
  int created = ::mkostemp(name.data(), O_CLOEXEC);
  if (created < 0)
    return Status::error("cannot create a temporary file next to '" + path +
                         "': " + errnoMessage(errno));
  fd = created;
  tmpPath = name.data();
  // mkstemp creates 0600; a data or checkpoint file is for everyone to read.
  // (umask() cannot be read without changing it, which is not thread-safe.)
  ::fchmod(fd, 0644);
  return Status::ok();
}

Status AtomicFile::write(const void *data, size_t bytes) {
  if (fd < 0)
    return Status::error("'" + path + "' is not open for writing");
  const char *p = static_cast<const char *>(data);
  while (bytes > 0) {
    ssize_t n = ::write(fd, p, bytes);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0) {
      Status st = Status::error("cannot write '" + tmpPath +
                                "': " + errnoMessage(n < 0 ? errno : EIO));
      discard();
      return st;
    }
    p += n;
    bytes -= static_cast<size_t>(n);
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
  // Make the rename itself durable; failing to open the folder is harmless.
  int dirFd = ::open(parentDirectory(path).c_str(), O_RDONLY | O_CLOEXEC);
  if (dirFd >= 0) {
    ::fsync(dirFd);
    ::close(dirFd);
  }
  return Status::ok();
}

} // namespace piper::runtime
