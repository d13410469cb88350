// The TCP rendezvous store's client: length-prefixed requests (hello, set,
// get; TcpStoreWire.h) over one connection; waiting is polling with get.
#include "runtime/comm/TcpStore.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <unistd.h>

#include <gloo/common/error.h>

#include "runtime/comm/TcpStoreWire.h"
#include "support/Errno.h"
#include "support/FileIO.h"

namespace piper::runtime {

using namespace tcpstore;

namespace {

using Clock = std::chrono::steady_clock;

/// The largest reply a client reads (a value it asked for).
constexpr uint32_t kMaxReply = 64u << 20;

bool sendMessage(int fd, const std::string &payload) {
  std::string f = frame(payload);
  return sendAll(fd, f.data(), f.size());
}

/// Reads one frame into `payload`; a frame over `cap` bytes fails with
/// EMSGSIZE before anything is allocated for it.
bool recvMessage(int fd, std::string &payload, uint32_t cap) {
  char len[4];
  if (!recvAll(fd, len, 4))
    return false;
  uint32_t n = readU32(len);
  if (n > cap) {
    errno = EMSGSIZE;
    return false;
  }
  payload.assign(n, '\0');
  return recvAll(fd, payload.data(), n);
}

void setTimeouts(int fd, std::chrono::milliseconds timeout) {
  timeval tv;
  tv.tv_sec = static_cast<time_t>(timeout.count() / 1000);
  tv.tv_usec = static_cast<suseconds_t>((timeout.count() % 1000) * 1000);
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

/// A key Gloo waits for, as a message names it: Gloo's keys are
/// "<group>/<member>", the group "__world__" or "<stream>[<ranks>]" (a
/// CommKey), so the member's world rank can be named.
std::string describeKey(const std::string &key) {
  std::string quoted = "'" + key + "'";
  size_t slash = key.rfind('/');
  if (slash == std::string::npos || slash + 1 >= key.size() ||
      key.find_first_not_of("0123456789", slash + 1) != std::string::npos ||
      key.size() - slash > 7)
    return quoted;
  size_t member = std::stoul(key.substr(slash + 1));
  std::string group = key.substr(0, slash);
  if (group == "__world__")
    return "rank " + std::to_string(member) + " (key " + quoted + ")";
  size_t open = group.rfind('[');
  if (open == std::string::npos || group.back() != ']')
    return quoted;
  std::vector<std::string> ranks;
  std::string list = group.substr(open + 1, group.size() - open - 2);
  size_t start = 0;
  while (start <= list.size()) {
    size_t comma = list.find(',', start);
    ranks.push_back(list.substr(
        start, comma == std::string::npos ? std::string::npos : comma - start));
    if (comma == std::string::npos)
      break;
    start = comma + 1;
  }
  if (member >= ranks.size() || ranks[member].empty() ||
      ranks[member].find_first_not_of("0123456789") != std::string::npos)
    return quoted;
  return "rank " + ranks[member] + " (key " + quoted + ")";
}

} // namespace

// ---------------------------------------------------------------- client

/// Opens a TCP connection to one of `host`:`port`'s addresses, retrying
/// until `deadline`; -1 (and `error`) when none answered in time.
static int connectBy(const std::string &host, int port,
                     Clock::time_point deadline, std::string &error) {
  while (true) {
    addrinfo *addrs = nullptr;
    Status st = resolve(host, port, addrs);
    if (!st) {
      error = st.message();
      return -1;
    }
    int fd = -1;
    for (addrinfo *a = addrs; a && fd < 0; a = a->ai_next) {
      fd =
          ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
      if (fd >= 0 && ::connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
        error = errnoMessage(errno);
        ::close(fd);
        fd = -1;
      }
    }
    ::freeaddrinfo(addrs);
    if (fd >= 0 || Clock::now() >= deadline)
      return fd;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

std::shared_ptr<TcpStore> TcpStore::connect(const std::string &host, int port,
                                            const std::string &jobId, int rank,
                                            int worldSize,
                                            std::chrono::milliseconds timeout,
                                            Status &status) {
  std::shared_ptr<TcpStore> store(new TcpStore());
  store->where = host + ":" + std::to_string(port);
  store->timeout = timeout;
  auto deadline = Clock::now() + timeout;
  std::string hello(1, kHello);
  putString(hello, jobId);
  putU32(hello, static_cast<uint32_t>(rank));
  putU32(hello, static_cast<uint32_t>(worldSize));
  // A busy store (one that closed this connection to make room for newer
  // ones without a hello) or one that closes without a word is tried again
  // until the deadline; the error then names the last reason.
  std::string lastError = "no address";
  while (true) {
    int fd = connectBy(host, port, deadline, lastError);
    if (fd < 0) {
      status = Status::error(
          "cannot reach the rendezvous store at " + store->where + " within " +
          std::to_string(timeout.count() / 1000) + " s (" + lastError +
          "; is rank 0 running, and MASTER_ADDR/MASTER_PORT "
          "the same on every rank?)");
      return nullptr;
    }
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    setTimeouts(fd, timeout);
    std::string reply;
    bool answered = sendMessage(fd, hello) &&
                    recvMessage(fd, reply, kMaxHelloReply) && !reply.empty();
    int err = errno;
    if (answered && reply[0] == kOk) {
      store->fd = fd;
      return store;
    }
    ::close(fd);
    if (answered && reply[0] != kBusy) {
      status = Status::error("the rendezvous store at " + store->where +
                             " refused rank " + std::to_string(rank) + ": " +
                             reply.substr(1));
      return nullptr;
    }
    lastError = answered ? reply.substr(1)
                : err == EAGAIN || err == EWOULDBLOCK
                    ? std::string("no answer to its hello")
                : err == ECONNRESET || err == EPIPE
                    ? std::string("the store closed the connection without "
                                  "answering its hello")
                    : errnoMessage(err);
    if (!answered && err == EMSGSIZE) {
      status = Status::error("the rendezvous store at " + store->where +
                             " answered rank " + std::to_string(rank) +
                             "'s hello with a frame too large (is something "
                             "else listening on this port?)");
      return nullptr;
    }
    if (Clock::now() >= deadline) {
      status = Status::error(
          "the rendezvous store at " + store->where + " did not admit rank " +
          std::to_string(rank) + " within " +
          std::to_string(timeout.count() / 1000) + " s (" + lastError + ")");
      return nullptr;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

TcpStore::~TcpStore() {
  if (fd >= 0)
    ::close(fd);
}

Status TcpStore::call(const std::string &request, std::string &reply) {
  std::lock_guard<std::mutex> lock(mu);
  if (!lost.empty())
    return Status::error(lost);
  if (!sendMessage(fd, request) || !recvMessage(fd, reply, kMaxReply)) {
    int err = errno;
    lost = "lost the rendezvous store at " + where + ": " +
           (err == EAGAIN || err == EWOULDBLOCK
                ? "no answer within " + std::to_string(timeout.count() / 1000) +
                      " s"
                : errnoMessage(err));
    return Status::error(lost);
  }
  if (!reply.empty() && reply[0] == kError)
    return Status::error("the rendezvous store at " + where + ": " +
                         reply.substr(1));
  return Status::ok();
}

Status TcpStore::setValue(const std::string &key, const std::string &value) {
  std::string request(1, kSet), reply;
  putString(request, key);
  putString(request, value);
  return call(request, reply);
}

Status TcpStore::has(const std::string &key, bool &present) {
  std::string request(1, kGet), reply;
  putString(request, key);
  PIPER_RETURN_IF_ERROR(call(request, reply));
  present = !reply.empty() && reply[0] == kValue;
  return Status::ok();
}

Status TcpStore::getValue(const std::string &key, std::string &value,
                          bool &present) {
  std::string request(1, kGet), reply;
  putString(request, key);
  PIPER_RETURN_IF_ERROR(call(request, reply));
  present = !reply.empty() && reply[0] == kValue;
  value = present ? reply.substr(1) : std::string();
  return Status::ok();
}

Status TcpStore::waitFor(const std::vector<std::string> &keys,
                         std::chrono::milliseconds wait,
                         std::vector<std::string> &missing) {
  auto deadline = Clock::now() + wait;
  missing = keys;
  auto pause = std::chrono::milliseconds(2);
  while (true) {
    std::vector<std::string> still;
    for (const std::string &key : missing) {
      bool present = false;
      PIPER_RETURN_IF_ERROR(has(key, present));
      if (!present)
        still.push_back(key);
    }
    missing.swap(still);
    if (missing.empty() || Clock::now() >= deadline)
      return Status::ok();
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(50));
  }
}

void TcpStore::set(const std::string &key, const std::vector<char> &value) {
  Status st = setValue(key, std::string(value.begin(), value.end()));
  if (!st)
    throw gloo::IoException(st.message());
}

std::vector<char> TcpStore::get(const std::string &key) {
  wait({key}, timeout);
  std::string request(1, kGet), reply;
  putString(request, key);
  Status st = call(request, reply);
  if (!st)
    throw gloo::IoException(st.message());
  if (reply.empty() || reply[0] != kValue)
    throw gloo::IoException("the rendezvous store at " + where +
                            " has no key '" + key + "'");
  return std::vector<char>(reply.begin() + 1, reply.end());
}

void TcpStore::wait(const std::vector<std::string> &keys) {
  wait(keys, timeout);
}

void TcpStore::wait(const std::vector<std::string> &keys,
                    const std::chrono::milliseconds &wait) {
  std::vector<std::string> missing;
  Status st = waitFor(keys, wait, missing);
  if (!st)
    throw gloo::IoException(st.message());
  if (!missing.empty()) {
    std::string list;
    for (const std::string &k : missing)
      list += (list.empty() ? "" : ", ") + describeKey(k);
    throw gloo::IoException(
        "timed out after " + std::to_string(wait.count() / 1000) +
        " s waiting in the rendezvous store at " + where + " for " + list);
  }
}

} // namespace piper::runtime
