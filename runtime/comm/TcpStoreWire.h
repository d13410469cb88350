// The TCP store's wire format, shared by its server and client: frames of a
// little-endian u32 length and a payload whose first byte says what it is.
#ifndef PIPER_RUNTIME_COMM_TCPSTOREWIRE_H
#define PIPER_RUNTIME_COMM_TCPSTOREWIRE_H

#include <cstdint>
#include <cstring>
#include <string>

#include <netdb.h>
#include <sys/socket.h>

#include "support/Status.h"

namespace piper::runtime::tcpstore {

// Requests: "H" hello (job id, rank, world), "S" set (key, value), "G" get
// (key). Replies: "O" ok, "V" + value, "N" no such key, "E" + an error (a
// refused hello is followed by the server closing the connection), "B" +
// why the store is busy (this connection, without a hello, was closed to
// make room for newer ones: try again).
constexpr char kHello = 'H', kSet = 'S', kGet = 'G';
constexpr char kOk = 'O', kValue = 'V', kNone = 'N', kError = 'E', kBusy = 'B';

/// The largest reply to a hello a client reads (an error naming two jobs).
constexpr uint32_t kMaxHelloReply = 64u << 10;

inline void putU32(std::string &out, uint32_t v) {
  for (int i = 0; i < 4; ++i)
    out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

inline uint32_t readU32(const char *p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i)
    v |= uint32_t(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}

inline void putString(std::string &out, const std::string &s) {
  putU32(out, static_cast<uint32_t>(s.size()));
  out += s;
}

/// Reads what putU32 wrote, from `in` at `pos`.
inline bool takeU32(const std::string &in, size_t &pos, uint32_t &v) {
  if (pos > in.size() || in.size() - pos < 4)
    return false;
  v = readU32(in.data() + pos);
  pos += 4;
  return true;
}

/// Reads what putString wrote, from `in` at `pos`.
inline bool takeString(const std::string &in, size_t &pos, std::string &s) {
  uint32_t n = 0;
  if (!takeU32(in, pos, n) || in.size() - pos < n)
    return false;
  s = in.substr(pos, n);
  pos += n;
  return true;
}

/// `payload` as a frame.
inline std::string frame(const std::string &payload) {
  std::string out;
  putU32(out, static_cast<uint32_t>(payload.size()));
  out += payload;
  return out;
}

/// The addresses of `host`:`port` for TCP.
inline Status resolve(const std::string &host, int port, addrinfo *&out) {
  addrinfo hints = {};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  std::string service = std::to_string(port);
  int rc = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &out);
  if (rc != 0)
    return Status::error("cannot resolve '" + host + "': " + gai_strerror(rc));
  return Status::ok();
}

} // namespace piper::runtime::tcpstore

#endif // PIPER_RUNTIME_COMM_TCPSTOREWIRE_H
