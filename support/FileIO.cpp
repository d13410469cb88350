#include "support/FileIO.h"

#include <cerrno>

#include <sys/socket.h>
#include <sys/types.h>
#include <unistd.h>

namespace piper {
namespace {

/// Moves `n` bytes at `data` with `step(p, left)`, a read or write that may
/// move fewer, until all are moved; EINTR retries. A step that moves nothing
/// fails with errno = `stalled` (0: errno as it was, a short file).
template <typename Step>
bool moveAll(const void *data, size_t n, int stalled, Step step) {
  char *p = static_cast<char *>(const_cast<void *>(data));
  while (n > 0) {
    ssize_t got = step(p, n);
    if (got < 0 && errno == EINTR)
      continue;
    if (got <= 0) {
      if (got == 0 && stalled != 0)
        errno = stalled;
      return false;
    }
    p += got;
    n -= static_cast<size_t>(got);
  }
  return true;
}

} // namespace

bool preadAll(int fd, void *out, size_t n, uint64_t offset) {
  return moveAll(out, n, 0, [&](char *p, size_t left) {
    ssize_t got = ::pread(fd, p, left, static_cast<off_t>(offset));
    if (got > 0)
      offset += static_cast<uint64_t>(got);
    return got;
  });
}

bool writeAll(int fd, const void *data, size_t n) {
  return moveAll(data, n, EIO, [&](char *p, size_t left) {
    return ::write(fd, p, left);
  });
}

bool sendAll(int fd, const void *data, size_t n) {
  return moveAll(data, n, 0, [&](char *p, size_t left) {
    return ::send(fd, p, left, MSG_NOSIGNAL);
  });
}

bool recvAll(int fd, void *out, size_t n) {
  return moveAll(out, n, ECONNRESET, [&](char *p, size_t left) {
    return ::recv(fd, p, left, 0);
  });
}

} // namespace piper
