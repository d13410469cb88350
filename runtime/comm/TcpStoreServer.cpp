// The TCP rendezvous store's server: one thread, one poll loop over the
// listening socket and every connection, non-blocking sockets. A connection
// costs a fixed record until its hello names the store's job; it is closed
// (its descriptor and buffers released) as soon as it is refused, ends,
// misses its hello deadline, or is the oldest without a hello when a newer
// connection needs its place. So strangers on the port never keep a rank
// out: a rank's connection is accepted, and its hello read, at once.
#include "runtime/comm/TcpStore.h"

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <unistd.h>

#include <fmt/format.h>

#include "runtime/comm/TcpStoreWire.h"
#include "support/Errno.h"

namespace piper::runtime {

using namespace tcpstore;
using Clock = std::chrono::steady_clock;

namespace {

/// How long the server stops accepting when the process is out of
/// descriptors (accepting again at once would spin).
constexpr auto kAcceptBackoff = std::chrono::milliseconds(100);
/// At most this many connections are accepted per turn of the loop, so that
/// a flood of them cannot starve the ranks already connected (and at most
/// half the budget of connections without a hello, so that one accepted in
/// a turn is polled for its hello before newer ones can push it out).
constexpr size_t kAcceptsPerTurn = 256;
/// Descriptors the budget of connections without a hello leaves to the rest
/// of rank 0's process (its files and pipes), beside two per rank (a store
/// connection and a Gloo pair).
constexpr size_t kReservedDescriptors = 256;
/// The budget is never lowered below this (a process that short of
/// descriptors recovers by closing the oldest stranger on EMFILE).
constexpr size_t kMinPending = 16;
/// Refusals reported one by one; after that, one line per interval.
constexpr size_t kLoggedRefusals = 5;
constexpr auto kLogInterval = std::chrono::seconds(10);
/// A frame's buffer grows by at least this much as its bytes arrive.
constexpr size_t kChunk = 64 << 10;

/// "address:port" of the peer in `addr`, for messages.
std::string peerName(const sockaddr_storage &addr) {
  char host[NI_MAXHOST], service[NI_MAXSERV];
  if (::getnameinfo(reinterpret_cast<const sockaddr *>(&addr), sizeof(addr),
                    host, sizeof(host), service, sizeof(service),
                    NI_NUMERICHOST | NI_NUMERICSERV) != 0)
    return "an unknown peer";
  return addr.ss_family == AF_INET6 ? fmt::format("[{}]:{}", host, service)
                                    : fmt::format("{}:{}", host, service);
}

/// limits.maxPending, lowered so that the connections without a hello, the
/// ranks' and the reserve fit under RLIMIT_NOFILE.
size_t pendingBudget(const TcpStoreLimits &limits, int worldSize) {
  size_t cap = size_t(limits.maxPending);
  rlimit nofile = {};
  if (::getrlimit(RLIMIT_NOFILE, &nofile) != 0 ||
      nofile.rlim_cur == RLIM_INFINITY)
    return cap;
  size_t reserved = kReservedDescriptors + 2 * size_t(worldSize);
  size_t room =
      nofile.rlim_cur > reserved ? size_t(nofile.rlim_cur) - reserved : 0;
  return std::min(cap, std::max(room, kMinPending));
}

} // namespace

/// One client connection and where its current frame stands.
struct TcpStoreServer::Connection {
  int fd = -1;
  std::string peer;
  bool greeted = false;
  /// Close once `out` is sent (a refusal).
  bool closing = false;
  Clock::time_point helloBy;
  /// The frame being read: its length prefix, then its payload.
  char head[4];
  size_t headGot = 0;
  uint32_t need = 0;
  std::string in;
  size_t inGot = 0;
  /// Replies not sent yet.
  std::string out;
  size_t sent = 0;
};

std::unique_ptr<TcpStoreServer>
TcpStoreServer::start(const std::string &host, int port,
                      const std::string &jobId, int worldSize, Status &status,
                      const TcpStoreLimits &limits, Log log) {
  std::string where = host + ":" + std::to_string(port);
  std::string what = "cannot serve the rendezvous store on " + where + ": ";
  if (worldSize < 1 || limits.maxPending < 1 || limits.maxHello < 16) {
    status = Status::error(what + "bad world size or limits");
    return nullptr;
  }
  addrinfo *addrs = nullptr;
  status = resolve(host, port, addrs);
  if (!status) {
    status = Status::error(what + status.message());
    return nullptr;
  }
  std::unique_ptr<TcpStoreServer> server(new TcpStoreServer());
  server->jobId = jobId;
  server->worldSize = worldSize;
  server->limits = limits;
  server->log = std::move(log);
  server->joined.assign(size_t(worldSize), false);
  server->pendingCap = pendingBudget(limits, worldSize);
  int err = 0;
  for (addrinfo *a = addrs; a && server->listenFd < 0; a = a->ai_next) {
    int fd =
        ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK,
                 a->ai_protocol);
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
    status = Status::error(what + errnoMessage(err) + hint);
    return nullptr;
  }
  if (::pipe2(server->wakeFds, O_CLOEXEC | O_NONBLOCK) != 0) {
    status = Status::error(what + "cannot create a pipe: " + errnoMessage(errno));
    return nullptr; // the destructor closes the socket
  }
  TcpStoreServer *s = server.get();
  server->server = std::thread([s] { s->loop(); });
  status = Status::ok();
  return server;
}

TcpStoreServer::~TcpStoreServer() {
  if (server.joinable()) {
    char stop = 's';
    while (::write(wakeFds[1], &stop, 1) < 0 && errno == EINTR) {
    }
    server.join();
  }
  for (auto &c : connections)
    close(*c);
  for (int fd : {listenFd, wakeFds[0], wakeFds[1]})
    if (fd >= 0)
      ::close(fd);
}

void TcpStoreServer::close(Connection &c) {
  if (c.fd < 0)
    return;
  ::close(c.fd);
  c.fd = -1;
  if (!c.greeted)
    --pending;
  openCount.fetch_sub(1);
  // Its buffers go with the record, erased by the loop.
}

void TcpStoreServer::refused(const std::string &what) {
  refusedCount.fetch_add(1);
  if (!log)
    return;
  if (logged < kLoggedRefusals) {
    ++logged;
    log(what);
    if (logged == kLoggedRefusals)
      nextLog = Clock::now() + kLogInterval;
    return;
  }
  ++unlogged;
  if (Clock::now() >= nextLog) {
    log(fmt::format("{} more connection{} refused (the last: {})", unlogged,
                    unlogged == 1 ? "" : "s", what));
    unlogged = 0;
    nextLog = Clock::now() + kLogInterval;
  }
}

void TcpStoreServer::loop() {
  std::vector<pollfd> fds;
  Clock::time_point acceptAgainAt{};
  while (true) {
    auto now = Clock::now();
    // A connection that has not said hello in time goes.
    Clock::time_point wakeAt = now + std::chrono::seconds(1);
    for (auto &c : connections) {
      if (c->greeted || c->fd < 0)
        continue;
      if (now >= c->helloBy) {
        refused(fmt::format("closed a connection from {} that said no hello "
                            "within {} ms",
                            c->peer, limits.helloTimeout.count()));
        close(*c);
      } else {
        wakeAt = std::min(wakeAt, c->helloBy);
      }
    }
    connections.erase(std::remove_if(connections.begin(), connections.end(),
                                     [](auto &c) { return c->fd < 0; }),
                      connections.end());
    const bool accepting = now >= acceptAgainAt;
    if (!accepting)
      wakeAt = std::min(wakeAt, acceptAgainAt);
    fds.clear();
    fds.push_back({wakeFds[0], POLLIN, 0});
    // poll() skips a negative descriptor: no accepting while backing off.
    fds.push_back({accepting ? listenFd : -1, POLLIN, 0});
    for (auto &c : connections)
      fds.push_back(
          {c->fd, short(POLLIN | (c->sent < c->out.size() ? POLLOUT : 0)), 0});
    auto wait =
        std::chrono::duration_cast<std::chrono::milliseconds>(wakeAt - now)
            .count();
    int ready =
        ::poll(fds.data(), fds.size(), int(std::max<long long>(1, wait + 1)));
    if (ready < 0 && errno != EINTR) {
      // Only EINVAL or ENOMEM: wait rather than spin.
      ::poll(nullptr, 0, 10);
      continue;
    }
    if (fds[0].revents != 0)
      return; // the destructor asks to stop
    for (size_t i = 0; i < connections.size(); ++i) {
      Connection &c = *connections[i];
      short events = fds[i + 2].revents;
      if (events & (POLLIN | POLLHUP | POLLERR))
        readSome(c);
      if (c.fd >= 0 && (events & POLLOUT))
        flush(c);
    }
    if (accepting && (fds[1].revents & POLLIN))
      acceptSome(acceptAgainAt);
  }
}

void TcpStoreServer::acceptSome(Clock::time_point &acceptAgainAt) {
  // Connections before `cursor` have said hello or are closed; those
  // accepted here go after it.
  size_t cursor = 0;
  const size_t most = std::clamp<size_t>(pendingCap / 2, 1, kAcceptsPerTurn);
  for (size_t i = 0; i < most; ++i) {
    sockaddr_storage addr = {};
    socklen_t len = sizeof(addr);
    int fd = ::accept4(listenFd, reinterpret_cast<sockaddr *>(&addr), &len,
                       SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      int err = errno;
      if (err == EMFILE || err == ENFILE) {
        // A descriptor held by a connection without a hello is worth less
        // than the one waiting: the oldest such connection makes room.
        if (evictOldest(cursor,
                        fmt::format("its process is out of descriptors ({})",
                                    errnoMessage(err))))
          continue;
      }
      if (err == EMFILE || err == ENFILE || err == ENOBUFS || err == ENOMEM) {
        // The connection stays in the backlog; try again a little later.
        acceptAgainAt = Clock::now() + kAcceptBackoff;
        refused(fmt::format("cannot accept connections: {}", errnoMessage(err)));
      }
      return; // EAGAIN: none left; anything else: the next turn retries
    }
    if (pending >= pendingCap)
      evictOldest(cursor,
                  fmt::format("{} connections have not said hello (a flood "
                              "of connections on its port?)",
                              pending));
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    auto c = std::make_unique<Connection>();
    c->fd = fd;
    c->peer = peerName(addr);
    c->helloBy = Clock::now() + limits.helloTimeout;
    Connection &added = *c;
    connections.push_back(std::move(c));
    ++pending;
    openCount.fetch_add(1);
    // A rank sends its hello as soon as it is connected: answered now, it
    // owes nothing to the strangers around it.
    readSome(added);
  }
}

bool TcpStoreServer::evictOldest(size_t &cursor, const std::string &why) {
  for (; cursor < connections.size(); ++cursor) {
    Connection &c = *connections[cursor];
    if (c.fd < 0 || c.greeted)
      continue;
    // What it sent is dropped first (closing over unread bytes would reset
    // the connection, and the peer might lose the reason), then it is told,
    // in one small write its socket's buffer takes, unless a reply is
    // already under way.
    char drain[4096];
    ssize_t ignored = ::recv(c.fd, drain, sizeof(drain), MSG_DONTWAIT);
    if (c.out.empty()) {
      std::string busy =
          frame(std::string(1, kBusy) + "the rendezvous store is busy: " + why +
                "; this connection, the oldest without a hello, was closed to "
                "make room");
      ignored =
          ::send(c.fd, busy.data(), busy.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    }
    (void)ignored;
    refused(fmt::format("closed a connection from {} that had not said hello: "
                        "{}",
                        c.peer, why));
    close(c);
    ++cursor;
    return true;
  }
  return false;
}

void TcpStoreServer::readSome(Connection &c) {
  while (c.fd >= 0 && !c.closing) {
    char *dest;
    size_t room;
    if (c.headGot < 4) {
      dest = c.head + c.headGot;
      room = 4 - c.headGot;
    } else {
      // Grown as the bytes come, never to more than the frame announced.
      if (c.inGot == c.in.size())
        c.in.resize(std::min<size_t>(
            c.need, std::max<size_t>(c.in.size() * 2, kChunk)));
      dest = c.in.data() + c.inGot;
      room = c.in.size() - c.inGot;
    }
    ssize_t got = ::recv(c.fd, dest, room, 0);
    if (got < 0 && errno == EINTR)
      continue;
    if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
      return;
    if (got <= 0) {
      close(c); // the peer went, or the connection failed
      return;
    }
    if (c.headGot < 4) {
      c.headGot += size_t(got);
      if (c.headGot < 4)
        continue;
      c.need = readU32(c.head);
      uint32_t cap = c.greeted ? limits.maxMessage : limits.maxHello;
      if (c.need == 0 || c.need > cap) {
        // Nothing is allocated for a frame over the cap: refuse and close.
        std::string why =
            c.need == 0
                ? std::string("an empty request")
                : fmt::format("a {} of {} bytes (at most {})",
                              c.greeted ? "request" : "hello", c.need, cap);
        c.out += frame(std::string(1, kError) + why);
        c.closing = true;
        if (!c.greeted)
          refused(fmt::format("refused a connection from {}: {}", c.peer, why));
        flush(c);
        return;
      }
      c.in.clear();
      c.inGot = 0;
      continue;
    }
    c.inGot += size_t(got);
    if (c.inGot < c.need)
      continue;
    std::string request;
    request.swap(c.in);
    c.headGot = 0;
    c.inGot = 0;
    handle(c, request);
    flush(c);
  }
}

void TcpStoreServer::flush(Connection &c) {
  while (c.fd >= 0 && c.sent < c.out.size()) {
    ssize_t n = ::send(c.fd, c.out.data() + c.sent, c.out.size() - c.sent,
                       MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
      return;
    if (n <= 0) {
      close(c);
      return;
    }
    c.sent += size_t(n);
  }
  if (c.fd < 0)
    return;
  c.out.clear();
  c.sent = 0;
  if (c.closing)
    close(c);
}

void TcpStoreServer::handle(Connection &c, const std::string &request) {
  if (!c.greeted) {
    hello(c, request);
    return;
  }
  size_t pos = 1;
  std::string key, value;
  if (request[0] == kSet) {
    if (!takeString(request, pos, key) || !takeString(request, pos, value)) {
      c.out += frame(std::string(1, kError) + "malformed set");
      return;
    }
    data[key] = std::move(value);
    c.out += frame(std::string(1, kOk));
  } else if (request[0] == kGet) {
    if (!takeString(request, pos, key)) {
      c.out += frame(std::string(1, kError) + "malformed get");
      return;
    }
    auto it = data.find(key);
    c.out += frame(it == data.end() ? std::string(1, kNone)
                                    : std::string(1, kValue) + it->second);
  } else {
    c.out += frame(std::string(1, kError) + "unknown request");
  }
}

void TcpStoreServer::hello(Connection &c, const std::string &request) {
  size_t pos = 1;
  std::string theirJob;
  uint32_t rank = 0, world = 0;
  std::string error;
  if (request[0] != kHello)
    error = "the first request must be a hello";
  else if (!takeString(request, pos, theirJob) ||
           !takeU32(request, pos, rank) || !takeU32(request, pos, world))
    error = "malformed hello (not a piper-run rank?)";
  else if (theirJob != jobId)
    error = fmt::format(
        "rank {} is of job '{}', but this store serves job '{}' (another job "
        "on this port? every rank of one job must derive the same job id: "
        "PIPER_JOB_ID or the launcher's job id, the same strategy and the "
        "same --seed, --steps and other run options)",
        rank, theirJob, jobId);
  else if (int64_t(world) != worldSize)
    error = fmt::format("the rank says the world has {} ranks, the store's "
                        "job has {}",
                        world, worldSize);
  else if (int64_t(rank) >= worldSize)
    error = fmt::format("rank {} is outside the world of {} ranks", rank,
                        worldSize);
  else if (joined[rank])
    error = fmt::format("rank {} has already joined (two ranks with one "
                        "RANK, or another job on this port?)",
                        rank);
  if (!error.empty()) {
    c.out += frame(std::string(1, kError) + error);
    c.closing = true;
    refused(fmt::format("refused a connection from {}: {}", c.peer, error));
    return;
  }
  joined[rank] = true;
  c.greeted = true;
  --pending;
  c.out += frame(std::string(1, kOk));
}

} // namespace piper::runtime
