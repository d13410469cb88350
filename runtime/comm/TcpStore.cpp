// The TCP rendezvous store: length-prefixed requests ("H"ello, "S"et,
// "G"et) over one connection per client; waiting is polling with get.
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

namespace piper::runtime {

namespace {

using Clock = std::chrono::steady_clock;

/// A request or reply larger than this is refused (keys and values are
/// addresses: bytes, not megabytes).
constexpr uint32_t kMaxMessage = 64u << 20;

std::string errnoText(int err) {
  std::string s = std::strerror(err);
  if (!s.empty())
    s[0] = static_cast<char>(std::tolower(static_cast<unsigned char>(s[0])));
  return s;
}

void putU32(std::string &out, uint32_t v) {
  for (int i = 0; i < 4; ++i)
    out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

void putString(std::string &out, const std::string &s) {
  putU32(out, static_cast<uint32_t>(s.size()));
  out += s;
}

/// Reads what putU32/putString wrote, from `in` at `pos`.
bool takeU32(const std::string &in, size_t &pos, uint32_t &v) {
  if (pos > in.size() || in.size() - pos < 4)
    return false;
  v = 0;
  for (int i = 0; i < 4; ++i)
    v |= uint32_t(static_cast<unsigned char>(in[pos + i])) << (8 * i);
  pos += 4;
  return true;
}

bool takeString(const std::string &in, size_t &pos, std::string &s) {
  uint32_t n = 0;
  if (!takeU32(in, pos, n) || in.size() - pos < n)
    return false;
  s = in.substr(pos, n);
  pos += n;
  return true;
}

bool sendAll(int fd, const char *p, size_t n) {
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

bool recvAll(int fd, char *p, size_t n) {
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

bool sendMessage(int fd, const std::string &payload) {
  std::string frame;
  putU32(frame, static_cast<uint32_t>(payload.size()));
  frame += payload;
  return sendAll(fd, frame.data(), frame.size());
}

bool recvMessage(int fd, std::string &payload) {
  char len[4];
  if (!recvAll(fd, len, 4))
    return false;
  std::string l(len, 4);
  size_t pos = 0;
  uint32_t n = 0;
  takeU32(l, pos, n);
  if (n > kMaxMessage) {
    errno = EMSGSIZE;
    return false;
  }
  payload.assign(n, '\0');
  return recvAll(fd, payload.data(), n);
}

/// The addresses of `host`:`port` for TCP.
Status resolve(const std::string &host, int port, addrinfo *&out) {
  addrinfo hints = {};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  std::string service = std::to_string(port);
  int rc = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &out);
  if (rc != 0)
    return Status::error("cannot resolve '" + host + "': " + gai_strerror(rc));
  return Status::ok();
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

// ---------------------------------------------------------------- server

std::unique_ptr<TcpStoreServer>
TcpStoreServer::start(const std::string &host, int port,
                      const std::string &token, int worldSize, Status &status) {
  std::string where = host + ":" + std::to_string(port);
  std::string what = "cannot serve the rendezvous store on " + where + ": ";
  addrinfo *addrs = nullptr;
  status = resolve(host, port, addrs);
  if (!status) {
    status = Status::error(what + status.message());
    return nullptr;
  }
  std::unique_ptr<TcpStoreServer> server(new TcpStoreServer());
  server->token = token;
  server->worldSize = worldSize;
  int err = 0;
  for (addrinfo *a = addrs; a && server->listenFd < 0; a = a->ai_next) {
    int fd =
        ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      err = errno;
      continue;
    }
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd, a->ai_addr, a->ai_addrlen) != 0 || ::listen(fd, 1024) != 0) {
      err = errno;
      ::close(fd);
      continue;
    }
    sockaddr_storage bound = {};
    socklen_t len = sizeof(bound);
    ::getsockname(fd, reinterpret_cast<sockaddr *>(&bound), &len);
    server->boundPort =
        bound.ss_family == AF_INET6
            ? ntohs(reinterpret_cast<sockaddr_in6 *>(&bound)->sin6_port)
            : ntohs(reinterpret_cast<sockaddr_in *>(&bound)->sin_port);
    server->listenFd = fd;
  }
  ::freeaddrinfo(addrs);
  if (server->listenFd < 0) {
    std::string hint =
        err == EADDRINUSE      ? " (another job on this port? choose another "
                                 "MASTER_PORT)"
        : err == EADDRNOTAVAIL ? " (MASTER_ADDR must be an address of rank 0's "
                                 "machine)"
                               : "";
    status = Status::error(what + errnoText(err) + hint);
    return nullptr;
  }
  TcpStoreServer *s = server.get();
  server->acceptor = std::thread([s] { s->acceptLoop(); });
  status = Status::ok();
  return server;
}

TcpStoreServer::~TcpStoreServer() {
  stopping = true;
  if (acceptor.joinable())
    acceptor.join();
  std::vector<std::thread> threads;
  {
    std::lock_guard<std::mutex> lock(mu);
    for (int fd : clientFds)
      ::shutdown(fd, SHUT_RDWR);
    threads.swap(clients);
  }
  for (std::thread &t : threads)
    t.join();
  for (int fd : clientFds)
    ::close(fd);
  if (listenFd >= 0)
    ::close(listenFd);
}

void TcpStoreServer::acceptLoop() {
  while (!stopping) {
    pollfd pfd = {listenFd, POLLIN, 0};
    if (::poll(&pfd, 1, 100) <= 0)
      continue;
    int fd = ::accept4(listenFd, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0)
      continue;
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    std::lock_guard<std::mutex> lock(mu);
    if (stopping) {
      ::close(fd);
      break;
    }
    clientFds.push_back(fd);
    clients.emplace_back([this, fd] { serve(fd); });
  }
}

std::string TcpStoreServer::hello(const std::string &request, int fd) {
  (void)fd;
  size_t pos = 1;
  std::string theirToken;
  uint32_t rank = 0, world = 0;
  if (!takeString(request, pos, theirToken) || !takeU32(request, pos, rank) ||
      !takeU32(request, pos, world))
    return "Emalformed hello (not a piper-run rank?)";
  if (theirToken != token)
    return "Ewrong job token: this store belongs to another job (every rank "
           "of one job needs the same PIPER_JOB_TOKEN, strategy and launcher "
           "job id)";
  if (int(world) != worldSize)
    return "Ethe rank says the world has " + std::to_string(world) +
           " ranks, the store's job has " + std::to_string(worldSize);
  if (int(rank) >= worldSize)
    return "Erank " + std::to_string(rank) + " is outside the world of " +
           std::to_string(worldSize) + " ranks";
  std::lock_guard<std::mutex> lock(mu);
  if (std::find(joinedRanks.begin(), joinedRanks.end(), int(rank)) !=
      joinedRanks.end())
    return "Erank " + std::to_string(rank) +
           " has already joined (two ranks with one RANK, or another job on "
           "this port?)";
  joinedRanks.push_back(int(rank));
  return "O";
}

void TcpStoreServer::serve(int fd) {
  bool greeted = false;
  std::string request;
  while (!stopping && recvMessage(fd, request)) {
    std::string reply;
    if (request.empty()) {
      reply = "Eempty request";
    } else if (!greeted) {
      reply = request[0] == 'H' ? hello(request, fd)
                                : "Ethe first request must be a hello";
      greeted = reply == "O";
    } else if (request[0] == 'S') {
      size_t pos = 1;
      std::string key, value;
      if (!takeString(request, pos, key) || !takeString(request, pos, value)) {
        reply = "Emalformed set";
      } else {
        std::lock_guard<std::mutex> lock(mu);
        auto it = std::find_if(data.begin(), data.end(),
                               [&](const auto &kv) { return kv.first == key; });
        std::vector<char> bytes(value.begin(), value.end());
        if (it == data.end())
          data.emplace_back(key, std::move(bytes));
        else
          it->second = std::move(bytes);
        reply = "O";
      }
    } else if (request[0] == 'G') {
      size_t pos = 1;
      std::string key;
      if (!takeString(request, pos, key)) {
        reply = "Emalformed get";
      } else {
        std::lock_guard<std::mutex> lock(mu);
        auto it = std::find_if(data.begin(), data.end(),
                               [&](const auto &kv) { return kv.first == key; });
        reply = it == data.end()
                    ? std::string("N")
                    : "V" + std::string(it->second.begin(), it->second.end());
      }
    } else {
      reply = "Eunknown request";
    }
    if (!sendMessage(fd, reply) || (!greeted && reply[0] == 'E'))
      break;
  }
  // The fd stays open until the server goes: closing it here could let a
  // new connection reuse the number the destructor shuts down.
  ::shutdown(fd, SHUT_RDWR);
}

// ---------------------------------------------------------------- client

std::shared_ptr<TcpStore> TcpStore::connect(const std::string &host, int port,
                                            const std::string &token, int rank,
                                            int worldSize,
                                            std::chrono::milliseconds timeout,
                                            Status &status) {
  std::shared_ptr<TcpStore> store(new TcpStore());
  store->where = host + ":" + std::to_string(port);
  store->timeout = timeout;
  auto deadline = Clock::now() + timeout;
  std::string lastError = "no address";
  while (store->fd < 0) {
    addrinfo *addrs = nullptr;
    Status st = resolve(host, port, addrs);
    if (!st) {
      status = Status::error("cannot reach the rendezvous store at " +
                             store->where + ": " + st.message());
      return nullptr;
    }
    for (addrinfo *a = addrs; a && store->fd < 0; a = a->ai_next) {
      int fd =
          ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
      if (fd < 0)
        continue;
      if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
        store->fd = fd;
      } else {
        lastError = errnoText(errno);
        ::close(fd);
      }
    }
    ::freeaddrinfo(addrs);
    if (store->fd >= 0)
      break;
    if (Clock::now() >= deadline) {
      status = Status::error(
          "cannot reach the rendezvous store at " + store->where + " within " +
          std::to_string(timeout.count() / 1000) + " s (" + lastError +
          "; is rank 0 running, and MASTER_ADDR/MASTER_PORT "
          "the same on every rank?)");
      return nullptr;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  int one = 1;
  ::setsockopt(store->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  setTimeouts(store->fd, timeout);
  std::string hello = "H", reply;
  putString(hello, token);
  putU32(hello, static_cast<uint32_t>(rank));
  putU32(hello, static_cast<uint32_t>(worldSize));
  status = store->call(hello, reply);
  if (!status)
    return nullptr;
  if (reply != "O") {
    status = Status::error(
        "the rendezvous store at " + store->where + " refused rank " +
        std::to_string(rank) + ": " +
        (reply.empty() ? std::string("no reason") : reply.substr(1)));
    return nullptr;
  }
  return store;
}

TcpStore::~TcpStore() {
  if (fd >= 0)
    ::close(fd);
}

Status TcpStore::call(const std::string &request, std::string &reply) {
  std::lock_guard<std::mutex> lock(mu);
  if (!sendMessage(fd, request) || !recvMessage(fd, reply)) {
    int err = errno;
    return Status::error("lost the rendezvous store at " + where + ": " +
                         (err == EAGAIN || err == EWOULDBLOCK
                              ? "no answer within " +
                                    std::to_string(timeout.count() / 1000) +
                                    " s"
                              : errnoText(err)));
  }
  if (!reply.empty() && reply[0] == 'E' && request[0] != 'H')
    return Status::error("the rendezvous store at " + where + ": " +
                         reply.substr(1));
  return Status::ok();
}

Status TcpStore::setValue(const std::string &key, const std::string &value) {
  std::string request = "S", reply;
  putString(request, key);
  putString(request, value);
  return call(request, reply);
}

Status TcpStore::has(const std::string &key, bool &present) {
  std::string request = "G", reply;
  putString(request, key);
  PIPER_RETURN_IF_ERROR(call(request, reply));
  present = !reply.empty() && reply[0] == 'V';
  return Status::ok();
}

Status TcpStore::getValue(const std::string &key, std::string &value,
                          bool &present) {
  std::string request = "G", reply;
  putString(request, key);
  PIPER_RETURN_IF_ERROR(call(request, reply));
  present = !reply.empty() && reply[0] == 'V';
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
  std::string request = "G", reply;
  putString(request, key);
  Status st = call(request, reply);
  if (!st)
    throw gloo::IoException(st.message());
  if (reply.empty() || reply[0] != 'V')
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
