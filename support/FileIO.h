// Whole-buffer reads and writes on file descriptors and sockets: each loops
// over short transfers and EINTR, so that a caller sees all or an error.
#ifndef PIPER_SUPPORT_FILEIO_H
#define PIPER_SUPPORT_FILEIO_H

#include <cstddef>
#include <cstdint>

namespace piper {

/// Reads exactly `n` bytes of `fd` at `offset` into `out`; false on an
/// error (errno set) or a short file (errno left as it was).
bool preadAll(int fd, void *out, size_t n, uint64_t offset);

/// Writes the `n` bytes at `data` to `fd`; false on an error, with errno
/// set (EIO when write() makes no progress).
bool writeAll(int fd, const void *data, size_t n);

/// Sends the `n` bytes at `data` on socket `fd` (MSG_NOSIGNAL: a closed
/// peer is an error, not SIGPIPE); false on an error or a closed peer.
bool sendAll(int fd, const void *data, size_t n);

/// Receives exactly `n` bytes from socket `fd` into `out`; false on an
/// error, or with errno = ECONNRESET when the peer closes first.
bool recvAll(int fd, void *out, size_t n);

} // namespace piper

#endif // PIPER_SUPPORT_FILEIO_H
