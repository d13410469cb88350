// The TCP store under a flood of connections that are not ranks: oversized
// hellos, thousands of strangers, a full descriptor table, idle connections,
// half-hellos and a slowloris. The store must allocate nothing before a hello
// names its job, release every descriptor it is done with, never spin, and
// let real ranks in at once whatever the strangers do. Only
// the store's original interface is used, so that the file also runs against
// older stores. Loopback only; every loop is bounded in count and time.
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include <dirent.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "runtime/comm/TcpStore.h"

using namespace piper;

using namespace piper::runtime;
using namespace std::chrono_literals;

namespace {

/// The store's documented limit of connections that have not said hello.
constexpr int kMaxPending = 64;

std::unique_ptr<TcpStoreServer> serve(const std::string &job, int world) {
  Status st;
  auto server = TcpStoreServer::start("127.0.0.1", 0, job, world, st);
  INFO(st.message());
  REQUIRE(server);
  return server;
}

/// The descriptors this process has open now, and the highest number.
std::vector<int> openDescriptorList() {
  std::vector<int> fds;
  DIR *dir = ::opendir("/proc/self/fd");
  REQUIRE(dir);
  int own = ::dirfd(dir);
  while (dirent *e = ::readdir(dir))
    if (e->d_name[0] != '.' && std::atoi(e->d_name) != own)
      fds.push_back(std::atoi(e->d_name));
  ::closedir(dir);
  return fds;
}

size_t openDescriptors() { return openDescriptorList().size(); }

/// This process's resident memory, in bytes.
long long residentBytes() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("VmRSS:", 0) == 0)
      return std::atoll(line.c_str() + 6) * 1024;
  return -1;
}

double cpuSeconds() {
  timespec ts;
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + double(ts.tv_nsec) / 1e9;
}

/// Whether the open descriptors come back to `baseline` within 10 s and
/// stay there (connections still in the listen backlog when their clients
/// closed them are accepted later, and must then be closed too).
bool descriptorsBackTo(size_t baseline) {
  auto end = std::chrono::steady_clock::now() + 10s;
  while (std::chrono::steady_clock::now() < end) {
    if (openDescriptors() <= baseline) {
      std::this_thread::sleep_for(300ms);
      if (openDescriptors() <= baseline)
        return true;
    }
    std::this_thread::sleep_for(10ms);
  }
  return false;
}

/// A plain TCP connection to 127.0.0.1:`port`, -1 on failure.
int rawConnect(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return -1;
  sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(uint16_t(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr *>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return -1;
  }
  timeval tv{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  return fd;
}

void sendBytes(int fd, const std::string &bytes) {
  CHECK(::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL) ==
        ssize_t(bytes.size()));
}

std::string u32(uint32_t v) {
  std::string out;
  for (int i = 0; i < 4; ++i)
    out.push_back(char((v >> (8 * i)) & 0xff));
  return out;
}

/// A hello of job `job` as `rank` of `world`, as a frame.
std::string helloFrame(const std::string &job, uint32_t rank, uint32_t world) {
  std::string payload =
      "H" + u32(uint32_t(job.size())) + job + u32(rank) + u32(world);
  return u32(uint32_t(payload.size())) + payload;
}

/// What the server says until it closes the connection; "<no end>" is
/// appended when it had not closed it within 5 s. (A server that closes with
/// bytes of ours unread resets the connection: that is an end too.)
std::string readToEnd(int fd) {
  std::string all;
  char buf[4096];
  ssize_t got;
  while ((got = ::recv(fd, buf, sizeof(buf), 0)) > 0)
    all.append(buf, size_t(got));
  return got == 0 || errno == ECONNRESET ? all : all + "<no end>";
}

/// A real rank of job "j" is still served.
void checkServes(TcpStoreServer &server, int rank, int world) {
  Status st;
  auto c =
      TcpStore::connect("127.0.0.1", server.port(), "j", rank, world, 5s, st);
  INFO(st.message());
  REQUIRE(c);
  REQUIRE(c->setValue("k", "v"));
  std::string v;
  bool present = false;
  REQUIRE(c->getValue("k", v, present));
  CHECK((present && v == "v"));
}

} // namespace

TEST_CASE("tcp store: a hello announcing megabytes is refused before "
          "anything is allocated for it",
          "[comm][store][flood]") {
  auto server = serve("j", 1);
  long long before = residentBytes();
  std::vector<int> fds;
  for (int i = 0; i < 4; ++i) {
    int fd = rawConnect(server->port());
    REQUIRE(fd >= 0);
    sendBytes(fd, u32(48u << 20) + "H");
    fds.push_back(fd);
  }
  for (int fd : fds) {
    std::string said = readToEnd(fd);
    CHECK(said.find("a hello of 50331648 bytes (at most 4096)") !=
          std::string::npos);
    CHECK(said.find("<no end>") == std::string::npos);
    ::close(fd);
  }
  CHECK(residentBytes() - before < (16ll << 20));
  checkServes(*server, 0, 1);
}

TEST_CASE("tcp store: thousands of strangers leave no descriptor behind",
          "[comm][store][flood]") {
  auto server = serve("j", 2);
  const size_t baseline = openDescriptors();
  const int port = server->port();
  // Four kinds of strangers, at most 400 open at once: another job's hello,
  // bytes of another protocol, silence, and a connection closed at once.
  std::vector<int> open;
  int made = 0;
  auto start = std::chrono::steady_clock::now();
  for (; made < 3000 && std::chrono::steady_clock::now() - start < 30s;
       ++made) {
    int fd = rawConnect(port);
    REQUIRE(fd >= 0);
    if (made % 4 == 0)
      sendBytes(fd, helloFrame("another-job", 1, 2));
    else if (made % 4 == 1)
      sendBytes(fd, "GET / HTTP/1.0\r\n\r\n");
    if (made % 4 == 3) {
      ::close(fd);
      continue;
    }
    open.push_back(fd);
    if (open.size() > 400) {
      ::close(open.front());
      open.erase(open.begin());
    }
  }
  CHECK(made == 3000);
  for (int fd : open)
    ::close(fd);
  // The server closes its side of each (its descriptor and buffers go).
  bool released = descriptorsBackTo(baseline);
  INFO("open descriptors: " << openDescriptors() << ", baseline " << baseline);
  CHECK(released);
  checkServes(*server, 0, 2);
  checkServes(*server, 1, 2);
}

TEST_CASE("tcp store: out of descriptors, the server waits instead of "
          "spinning, then recovers",
          "[comm][store][flood]") {
  auto server = serve("j", 1);
  const int port = server->port();
  const size_t baseline = openDescriptors();
  // A limit on descriptor numbers that leaves 40 free ones below it.
  std::vector<int> list = openDescriptorList();
  std::sort(list.begin(), list.end());
  int limit = 0;
  for (size_t below = 0; limit - int(below) < 40; ++limit)
    below += std::binary_search(list.begin(), list.end(), limit);
  rlimit saved;
  REQUIRE(::getrlimit(RLIMIT_NOFILE, &saved) == 0);
  rlimit low = saved;
  low.rlim_cur = rlim_t(limit);
  REQUIRE(::setrlimit(RLIMIT_NOFILE, &low) == 0);
  // Connections until this process (clients and server alike) has no
  // descriptor left: the last ones wait in the listen backlog.
  std::vector<int> clients;
  for (int i = 0; i < 200; ++i) {
    int fd = rawConnect(port);
    if (fd < 0)
      break;
    clients.push_back(fd);
  }
  std::this_thread::sleep_for(200ms);
  double cpuBefore = cpuSeconds();
  std::this_thread::sleep_for(1s);
  double cpu = cpuSeconds() - cpuBefore;
  REQUIRE(::setrlimit(RLIMIT_NOFILE, &saved) == 0);
  INFO("clients connected: " << clients.size());
  CHECK(clients.size() < 200);
  // An accept loop that spins on EMFILE burns a whole core here.
  CHECK(cpu < 0.3);
  for (int fd : clients)
    ::close(fd);
  bool released = descriptorsBackTo(baseline);
  INFO("open descriptors: " << openDescriptors() << ", baseline " << baseline);
  CHECK(released);
  checkServes(*server, 0, 1);
}

TEST_CASE("tcp store: past the limit of connections without a hello, the "
          "oldest is told busy and closed; a rank gets in at once",
          "[comm][store][flood]") {
  TcpStoreLimits limits;
  limits.maxPending = kMaxPending;
  Status st;
  auto server = TcpStoreServer::start("127.0.0.1", 0, "j", 1, st, limits);
  REQUIRE(server);
  const int port = server->port();
  std::vector<int> idle;
  for (int i = 0; i < kMaxPending; ++i) {
    int fd = rawConnect(port);
    REQUIRE(fd >= 0);
    idle.push_back(fd);
    // In order, so that the first is the oldest.
    for (int w = 0; w < 100 && server->openConnections() < idle.size(); ++w)
      std::this_thread::sleep_for(1ms);
  }
  // The idle connections stay open: a store that refuses newcomers rather
  // than closing the oldest keeps the rank out until their hello deadline.
  auto start = std::chrono::steady_clock::now();
  checkServes(*server, 0, 1);
  CHECK(std::chrono::steady_clock::now() - start < 1s);
  std::string said = readToEnd(idle[0]);
  CHECK(said.find("the rendezvous store is busy: 64 connections have not "
                  "said hello (a flood of connections on its port?); this "
                  "connection, the oldest without a hello, was closed to "
                  "make room") != std::string::npos);
  CHECK(said.find("<no end>") == std::string::npos);
  for (int fd : idle)
    ::close(fd);
}

namespace {

/// Raises this process's soft RLIMIT_NOFILE to at least `want` (at most the
/// hard limit) for its lifetime.
struct DescriptorLimit {
  rlimit saved = {};
  bool ok = false;
  explicit DescriptorLimit(rlim_t want) {
    REQUIRE(::getrlimit(RLIMIT_NOFILE, &saved) == 0);
    rlimit raised = saved;
    if (raised.rlim_cur < want)
      raised.rlim_cur = std::min(want, raised.rlim_max);
    ok = raised.rlim_cur >= want && ::setrlimit(RLIMIT_NOFILE, &raised) == 0;
  }
  ~DescriptorLimit() { ::setrlimit(RLIMIT_NOFILE, &saved); }
};

/// Ranks 0 to `world` - 1 of job "j" meet as piper-run's do (TcpRendezvous:
/// hello, set "piper/arrived/<rank>", wait for every rank's key), each on
/// its own thread; the seconds until the last is through, or -1 and the
/// first error in `error`.
double rendezvousSeconds(int port, int world, std::chrono::milliseconds timeout,
                         std::string &error) {
  std::vector<std::string> errors(static_cast<size_t>(world));
  std::vector<std::thread> ranks;
  auto start = std::chrono::steady_clock::now();
  for (int r = 0; r < world; ++r)
    ranks.emplace_back([&, r] {
      Status st;
      auto store =
          TcpStore::connect("127.0.0.1", port, "j", r, world, timeout, st);
      if (store)
        st = store->setValue("piper/arrived/" + std::to_string(r), "here");
      std::vector<std::string> keys, missing;
      for (int k = 0; k < world; ++k)
        keys.push_back("piper/arrived/" + std::to_string(k));
      if (st)
        st = store->waitFor(keys, timeout, missing);
      if (!st)
        errors[size_t(r)] = st.message();
      else if (!missing.empty())
        errors[size_t(r)] = "missing " + missing.front();
    });
  for (auto &t : ranks)
    t.join();
  double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  for (const std::string &e : errors)
    if (!e.empty()) {
      error = e;
      return -1;
    }
  return seconds;
}

/// Waits until `server` has accepted `n` connections (or 5 s pass).
void waitAccepted(TcpStoreServer &server, size_t n) {
  auto end = std::chrono::steady_clock::now() + 5s;
  while (server.openConnections() < n && std::chrono::steady_clock::now() < end)
    std::this_thread::sleep_for(5ms);
}

} // namespace

// The bound: a store that lets strangers hold a rank out makes it wait for
// their hello deadline (10 s in the store before this one, 5 s now; the
// rank's 5 s timeout fails it first). A store that does not costs the rank
// only the turns of its loop over 1,000 records (microseconds each) and the
// accepting of the connections still in the backlog: the bound of a
// second is far from both, on any machine that runs the test at all.
TEST_CASE("tcp store: 1,000 idle connections delay a rendezvous by under a "
          "second, and another job's rank is still told why it is refused",
          "[comm][store][flood]") {
  constexpr int kIdle = 1000, kWorld = 4;
  // This process holds both ends of each idle connection.
  DescriptorLimit limit(2 * kIdle + 512);
  INFO("RLIMIT_NOFILE cannot be raised to " << 2 * kIdle + 512);
  REQUIRE(limit.ok);
  std::string error;
  auto quiet = serve("j", kWorld);
  double baseline = rendezvousSeconds(quiet->port(), kWorld, 5s, error);
  INFO(error);
  REQUIRE(baseline >= 0);

  auto server = serve("j", kWorld);
  const int port = server->port();
  std::vector<int> idle;
  for (int i = 0; i < kIdle; ++i) {
    int fd = rawConnect(port);
    REQUIRE(fd >= 0);
    idle.push_back(fd);
  }
  // The store before this one takes 64 of them and leaves the rest in the
  // backlog; this one takes all.
  waitAccepted(*server, kMaxPending);
  std::this_thread::sleep_for(100ms);
  double flooded = rendezvousSeconds(port, kWorld, 5s, error);
  INFO(error);
  std::printf("rendezvous of %d ranks: %.3f s alone, %.3f s beside %d idle "
              "connections\n",
              kWorld, baseline, flooded, kIdle);
  REQUIRE(flooded >= 0);
  CHECK(flooded - baseline < 1.0);

  // Refused for a real reason, a rank is told that reason, not "busy".
  Status st;
  CHECK_FALSE(TcpStore::connect("127.0.0.1", port, "k", 1, kWorld, 5s, st));
  CHECK(st.message().find("refused rank 1: rank 1 is of job 'k', but this "
                          "store serves job 'j'") != std::string::npos);
  CHECK_FALSE(TcpStore::connect("127.0.0.1", port, "j", 1, kWorld, 5s, st));
  CHECK(st.message().find("refused rank 1: rank 1 has already joined") !=
        std::string::npos);
  for (int fd : idle)
    ::close(fd);
}

TEST_CASE("tcp store: half-hellos and a slowloris neither block a rank nor "
          "keep their place past the hello deadline",
          "[comm][store][flood]") {
  constexpr int kHalf = 100;
  TcpStoreLimits limits;
  limits.helloTimeout = 2s;
  Status st;
  auto server = TcpStoreServer::start("127.0.0.1", 0, "j", 2, st, limits);
  REQUIRE(server);
  const int port = server->port();
  // A real hello's first 7 bytes: its length, "H", half the job id's length.
  std::string half = helloFrame("j", 0, 2).substr(0, 7);
  std::vector<int> halves;
  for (int i = 0; i < kHalf; ++i) {
    int fd = rawConnect(port);
    REQUIRE(fd >= 0);
    sendBytes(fd, half);
    halves.push_back(fd);
  }
  // A slowloris: a hello announcing 4,000 bytes, one byte per 100 ms.
  int slow = rawConnect(port);
  REQUIRE(slow >= 0);
  auto slowStart = std::chrono::steady_clock::now();
  double slowClosedAfter = -1;
  int slowBytes = 0;
  std::thread loris([&] {
    std::string bytes = u32(4000) + "H" + std::string(4000, 'x');
    for (; slowBytes < 50; ++slowBytes) {
      char b[1];
      ssize_t got = 0;
      if (::send(slow, &bytes[size_t(slowBytes)], 1, MSG_NOSIGNAL) != 1 ||
          (got = ::recv(slow, b, 1, MSG_DONTWAIT)) == 0 ||
          (got < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) {
        slowClosedAfter = std::chrono::duration<double>(
                              std::chrono::steady_clock::now() - slowStart)
                              .count();
        return;
      }
      std::this_thread::sleep_for(100ms);
    }
  });
  waitAccepted(*server, kMaxPending);
  std::this_thread::sleep_for(100ms);
  // The ranks get in long before the strangers' deadline (2 s): a store
  // that lets them hold a rank out fails the rank's 1.5 s timeout.
  std::string error;
  double seconds = rendezvousSeconds(port, 2, 1500ms, error);
  INFO(error);
  CHECK(seconds >= 0);
  CHECK(seconds < 1.0);
  loris.join();
  // Its trickle of bytes did not extend the deadline: closed after 2 s
  // (and less than 5 s: 50 bytes at 100 ms).
  INFO("slowloris closed after " << slowClosedAfter << " s, " << slowBytes
                                 << " bytes sent");
  CHECK(slowClosedAfter >= 1.9);
  CHECK(slowClosedAfter < 3.5);
  ::close(slow);
  for (int fd : halves) {
    CHECK(readToEnd(fd).find("<no end>") == std::string::npos);
    ::close(fd);
  }
}

TEST_CASE("tcp store: ranks get in while strangers keep connecting past the "
          "budget of connections without a hello",
          "[comm][store][flood]") {
  // 1,500 strangers open at once, beyond the store's budget of 1,024: each
  // new one closes the oldest, for as long as the ranks take (at most 5 s,
  // 20,000 connections).
  constexpr size_t kOpen = 1500;
  constexpr int kWorld = 4;
  DescriptorLimit limit(2 * kOpen + 512);
  INFO("RLIMIT_NOFILE cannot be raised to " << 2 * kOpen + 512);
  REQUIRE(limit.ok);
  auto server = serve("j", kWorld);
  const int port = server->port();
  std::atomic<bool> done{false};
  std::atomic<int> made{0};
  std::thread strangers([&] {
    std::vector<int> open;
    auto end = std::chrono::steady_clock::now() + 5s;
    while (!done && made < 20000 && std::chrono::steady_clock::now() < end) {
      int fd = rawConnect(port);
      if (fd < 0)
        break;
      ++made;
      open.push_back(fd);
      if (open.size() > kOpen) {
        ::close(open.front());
        open.erase(open.begin());
      }
    }
    for (int fd : open)
      ::close(fd);
  });
  while (made < int(kOpen))
    std::this_thread::sleep_for(5ms);
  std::string error;
  double seconds = rendezvousSeconds(port, kWorld, 3s, error);
  int during = made;
  done = true;
  strangers.join();
  std::printf("rendezvous of %d ranks: %.3f s while strangers connected "
              "(%d connections in all)\n",
              kWorld, seconds, during);
  INFO(error);
  REQUIRE(seconds >= 0);
  CHECK(seconds < 1.0);
}
