// The shared input reader (InputFile.h).
#include "proto/InputFile.h"

#include <cerrno>
#include <cstring>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "support/Errno.h"
#include "support/RegularFile.h"

namespace piper {
namespace {

std::string tooLarge(int64_t limit) {
  return "is more than the limit of " + std::to_string(limit) + " bytes";
}

/// Reads `fd` to its end into `out`, refusing more than `limit` bytes.
std::string readAll(int fd, std::string &out, int64_t limit) {
  out.clear();
  char chunk[1 << 16];
  while (true) {
    ssize_t n = ::read(fd, chunk, sizeof(chunk));
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0)
      return "cannot read: " + errnoMessage(errno);
    if (n == 0)
      return "";
    if (static_cast<int64_t>(out.size()) + n > limit) {
      out.clear();
      out.shrink_to_fit();
      return tooLarge(limit);
    }
    out.append(chunk, static_cast<size_t>(n));
  }
}

} // namespace

std::string checkInputPath(const std::string &path) {
  return path == "-" ? "" : regularFileProblem(path);
}

std::string readInputFile(const std::string &path, std::string &out,
                          int64_t limit) {
  out.clear();
  if (path == "-") {
    struct stat st;
    if (::fstat(STDIN_FILENO, &st) == 0 && S_ISREG(st.st_mode) &&
        st.st_size > limit)
      return tooLarge(limit);
    return readAll(STDIN_FILENO, out, limit);
  }
  if (std::string err = checkInputPath(path); !err.empty())
    return err;
  // O_NONBLOCK: should the path have become a FIFO since the check, open
  // returns at once instead of waiting for a writer.
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0)
    return "cannot open: " + errnoMessage(errno);
  struct stat st;
  std::string err;
  if (::fstat(fd, &st) != 0)
    err = "cannot stat: " + errnoMessage(errno);
  else if (!S_ISREG(st.st_mode))
    err = "is not a regular file";
  else if (st.st_size > limit)
    err = tooLarge(limit);
  else {
    out.reserve(static_cast<size_t>(st.st_size));
    err = readAll(fd, out, limit);
  }
  ::close(fd);
  return err;
}

std::string inputError(const std::string &what, const std::string &path,
                       const std::string &reason) {
  std::string who =
      path == "-" ? what + " on standard input" : what + " '" + path + "'";
  return who + (reason.rfind("cannot ", 0) == 0 ? ": " : " ") + reason;
}

} // namespace piper
