// The TCP store under a flood of connections that are not ranks: oversized
// hellos, thousands of strangers, a full descriptor table, idle connections.
// The store must allocate nothing before a hello names its job, release every
// descriptor it is done with, never spin, and keep serving real ranks. Only
// the store's original interface is used, so that the file also runs against
// older stores. Loopback only; every loop is bounded in count and time.
#include <algorithm>
#include <cerrno>
#include <chrono>
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

TEST_CASE("tcp store: idle connections past the limit are told busy; a rank "
          "still gets in once they go",
          "[comm][store][flood]") {
  auto server = serve("j", 1);
  const int port = server->port();
  std::vector<int> idle;
  for (int i = 0; i < kMaxPending; ++i) {
    int fd = rawConnect(port);
    REQUIRE(fd >= 0);
    idle.push_back(fd);
  }
  std::this_thread::sleep_for(200ms);
  int extra = rawConnect(port);
  REQUIRE(extra >= 0);
  std::string said = readToEnd(extra);
  ::close(extra);
  CHECK(said.find("the rendezvous store is busy: 64 connections have not "
                  "said hello yet") != std::string::npos);
  CHECK(said.find("<no end>") == std::string::npos);
  // A rank that comes now is told busy too, and tries again until the idle
  // connections are gone.
  std::thread later([&] {
    std::this_thread::sleep_for(500ms);
    for (int fd : idle)
      ::close(fd);
  });
  checkServes(*server, 0, 1);
  later.join();
}
