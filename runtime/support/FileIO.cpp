#include "runtime/support/FileIO.h"

#include <cerrno>

#include <sys/socket.h>
#include <sys/types.h>
#include <unistd.h>

namespace piper::runtime {

bool preadAll(int fd, void *out, size_t n, uint64_t offset) {
  char *p = static_cast<char *>(out);
  while (n > 0) {
    ssize_t got = ::pread(fd, p, n, static_cast<off_t>(offset));
    if (got < 0 && errno == EINTR)
      continue;
    if (got <= 0)
      return false;
    p += got;
    n -= static_cast<size_t>(got);
    offset += static_cast<uint64_t>(got);
  }
  return true;
}

bool writeAll(int fd, const void *data, size_t n) {
  const char *p = static_cast<const char *>(data);
  while (n > 0) {
    ssize_t done = ::write(fd, p, n);
    if (done < 0 && errno == EINTR)
      continue;
    if (done <= 0) {
      if (done == 0)
        errno = EIO;
      return false;
    }
    p += done;
    n -= static_cast<size_t>(done);
  }
  return true;
}

bool sendAll(int fd, const void *data, size_t n) {
  const char *p = static_cast<const char *>(data);
  while (n > 0) {
    ssize_t got = ::send(fd, p, n, MSG_NOSIGNAL);
    if (got < 0 && errno == EINTR)
      continue;
    if (got <= 0)
      return false;
    p += got;
    n -= static_cast<size_t>(got);
  }
  return true;
}

bool recvAll(int fd, void *out, size_t n) {
  char *p = static_cast<char *>(out);
  while (n > 0) {
    ssize_t got = ::recv(fd, p, n, 0);
    if (got < 0 && errno == EINTR)
      continue;
    if (got <= 0) {
      if (got == 0)
        errno = ECONNRESET;
      return false;
    }
    p += got;
    n -= static_cast<size_t>(got);
  }
  return true;
}

} // namespace piper::runtime
