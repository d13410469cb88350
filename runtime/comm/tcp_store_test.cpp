// Tests of the TCP rendezvous store: keys, job ids, refusals, bounded waits,
// floods of connections, and Gloo communicators met through it (threads as
// ranks, loopback only).
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "runtime/comm/TcpStore.h"
#include "runtime/comm/TcpStoreWire.h"

using namespace piper;

using namespace piper::runtime;
using namespace std::chrono_literals;

namespace {

std::unique_ptr<TcpStoreServer> serve(const std::string &token, int world) {
  Status st;
  auto server = TcpStoreServer::start("127.0.0.1", 0, token, world, st);
  INFO(st.message());
  REQUIRE(server);
  REQUIRE(server->port() > 0);
  return server;
}

/// Polls `done` every 10 ms until it holds or `timeout` passes.
template <typename F>
bool waitUntil(F done, std::chrono::milliseconds timeout) {
  auto end = std::chrono::steady_clock::now() + timeout;
  while (!done()) {
    if (std::chrono::steady_clock::now() > end)
      return false;
    std::this_thread::sleep_for(10ms);
  }
  return true;
}

/// A plain TCP connection to 127.0.0.1:`port`.
int rawConnect(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(fd >= 0);
  sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(uint16_t(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr *>(&addr), sizeof(addr)) ==
          0);
  timeval tv{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  return fd;
}

/// Reads what the server says until it closes the connection (or 5 s).
std::string readToEnd(int fd) {
  std::string all;
  char buf[4096];
  ssize_t got;
  while ((got = ::recv(fd, buf, sizeof(buf), 0)) > 0)
    all.append(buf, size_t(got));
  return got == 0 ? all : all + "<no end>";
}

} // namespace

TEST_CASE("tcp store: set, get and wait across clients", "[comm][store]") {
  auto server = serve("job-a", 2);
  Status st;
  auto a =
      TcpStore::connect("127.0.0.1", server->port(), "job-a", 0, 2, 5s, st);
  INFO(st.message());
  REQUIRE(a);
  auto b =
      TcpStore::connect("127.0.0.1", server->port(), "job-a", 1, 2, 5s, st);
  REQUIRE(b);
  CHECK(a->address() == "127.0.0.1:" + std::to_string(server->port()));

  std::thread later([&] {
    std::this_thread::sleep_for(100ms);
    std::vector<char> v = {'x', '\0', 'y'};
    a->set("k", v);
  });
  b->wait({"k"}, 5000ms);
  CHECK(b->get("k") == std::vector<char>{'x', '\0', 'y'});
  later.join();
  bool present = true;
  REQUIRE(a->has("nope", present));
  CHECK_FALSE(present);
}

TEST_CASE("tcp store: other jobs and duplicate ranks are refused",
          "[comm][store]") {
  std::vector<std::string> logged;
  std::mutex logMu;
  Status st;
  auto server =
      TcpStoreServer::start("127.0.0.1", 0, "job-a", 2, st, TcpStoreLimits(),
                            [&](const std::string &line) {
                              std::lock_guard<std::mutex> lock(logMu);
                              logged.push_back(line);
                            });
  REQUIRE(server);
  int port = server->port();
  // A stranger is told both jobs, and rank 0's side logs them too.
  CHECK_FALSE(TcpStore::connect("127.0.0.1", port, "job-b", 1, 2, 5s, st));
  CHECK(st.message() ==
        "the rendezvous store at 127.0.0.1:" + std::to_string(port) +
            " refused rank 1: rank 1 is of job 'job-b', but this store serves "
            "job 'job-a' (another job on this port? every rank of one job "
            "must derive the same job id: PIPER_JOB_ID or the launcher's job "
            "id, the same strategy and the same --seed, --steps and other run "
            "options)");
  {
    std::lock_guard<std::mutex> lock(logMu);
    REQUIRE(logged.size() == 1);
    CHECK(logged[0].rfind("refused a connection from 127.0.0.1:", 0) == 0);
    CHECK(logged[0].find(": rank 1 is of job 'job-b', but this store serves "
                         "job 'job-a'") != std::string::npos);
  }
  CHECK_FALSE(TcpStore::connect("127.0.0.1", port, "job-a", 1, 3, 5s, st));
  CHECK(st.message().find("the rank says the world has 3 ranks, the store's "
                          "job has 2") != std::string::npos);
  auto first = TcpStore::connect("127.0.0.1", port, "job-a", 1, 2, 5s, st);
  REQUIRE(first);
  CHECK_FALSE(TcpStore::connect("127.0.0.1", port, "job-a", 1, 2, 5s, st));
  CHECK(st.message().find("rank 1 has already joined") != std::string::npos);
  CHECK_FALSE(TcpStore::connect("127.0.0.1", port, "job-a", 2, 2, 5s, st));
  CHECK(st.message().find("rank 2 is outside the world of 2 ranks") !=
        std::string::npos);
  // Every refused connection is closed at once.
  CHECK(waitUntil([&] { return server->openConnections() == 1; }, 5s));
  CHECK(server->refusedConnections() == 4);
}

TEST_CASE("tcp store: every wait is bounded", "[comm][store]") {
  Status st;
  // Nobody listens on the port a finished server had.
  int port = serve("t", 1)->port();
  auto start = std::chrono::steady_clock::now();
  CHECK_FALSE(TcpStore::connect("127.0.0.1", port, "t", 0, 1, 1s, st));
  CHECK(std::chrono::steady_clock::now() - start < 5s);
  CHECK(st.message().find("cannot reach the rendezvous store at 127.0.0.1:" +
                          std::to_string(port) + " within 1 s") !=
        std::string::npos);

  auto server = serve("t", 1);
  auto c = TcpStore::connect("127.0.0.1", server->port(), "t", 0, 1, 1s, st);
  REQUIRE(c);
  std::vector<std::string> missing;
  REQUIRE(c->waitFor({"a", "b"}, 200ms, missing));
  CHECK(missing == std::vector<std::string>{"a", "b"});
  CHECK_THROWS_WITH(c->wait({"a"}, 200ms),
                    Catch::Contains("waiting in the rendezvous store") &&
                        Catch::Contains("for 'a'"));
  // Gloo's keys name the member of a group that never connected.
  CHECK_THROWS_WITH(c->wait({"__world__/3", "compute[0,2,5]/2"}, 200ms),
                    Catch::EndsWith("for rank 3 (key '__world__/3'), rank 5 "
                                    "(key 'compute[0,2,5]/2')"));
  // A port another job holds is a clear error, not a shared store.
  CHECK_FALSE(TcpStoreServer::start("127.0.0.1", server->port(), "u", 1, st));
  CHECK(st.message() == "cannot serve the rendezvous store on 127.0.0.1:" +
                            std::to_string(server->port()) +
                            ": address already in use (another job on this "
                            "port? choose another MASTER_PORT)");
}

TEST_CASE("tcp store: a call that got no answer loses the store for good",
          "[comm][store]") {
  // A store that admits the rank, then answers its first request only after
  // the client gave up on it (as a stopped rank 0 would once resumed).
  int lfd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(lfd >= 0);
  sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(lfd, reinterpret_cast<sockaddr *>(&addr), sizeof(addr)) == 0);
  REQUIRE(::listen(lfd, 4) == 0);
  socklen_t len = sizeof(addr);
  REQUIRE(::getsockname(lfd, reinterpret_cast<sockaddr *>(&addr), &len) == 0);
  int port = ntohs(addr.sin_port);
  std::mutex mu;
  std::condition_variable cv;
  bool gaveUp = false;
  std::thread slow([&] {
    int fd = ::accept(lfd, nullptr, nullptr);
    if (fd < 0)
      return;
    auto readFrame = [fd] {
      char n[4];
      if (::recv(fd, n, 4, MSG_WAITALL) != 4)
        return false;
      std::string payload(tcpstore::readU32(n), '\0');
      return payload.empty() || ::recv(fd, payload.data(), payload.size(),
                                       MSG_WAITALL) == ssize_t(payload.size());
    };
    auto reply = [fd](const std::string &payload) {
      std::string f = tcpstore::frame(payload);
      (void)!::send(fd, f.data(), f.size(), MSG_NOSIGNAL);
    };
    if (readFrame()) { // the hello
      reply(std::string(1, tcpstore::kOk));
      if (readFrame()) { // the first get: answered too late
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [&] { return gaveUp; });
        reply(std::string(1, tcpstore::kValue) + "stale");
        while (readFrame()) // any later request: an answer that would fit
          reply(std::string(1, tcpstore::kValue) + "stale");
      }
    }
    ::close(fd);
  });
  Status st;
  auto c = TcpStore::connect("127.0.0.1", port, "j", 0, 1, 1s, st);
  INFO(st.message());
  REQUIRE(c);
  std::string value;
  bool present = false;
  Status first = c->getValue("k", value, present);
  CHECK(first.message() == "lost the rendezvous store at 127.0.0.1:" +
                               std::to_string(port) +
                               ": no answer within 1 s");
  {
    std::lock_guard<std::mutex> lock(mu);
    gaveUp = true;
  }
  cv.notify_all();
  std::this_thread::sleep_for(100ms); // the late reply has arrived
  // Not read as the reply to the next request, and no second wait.
  auto start = std::chrono::steady_clock::now();
  Status second = c->getValue("k2", value, present);
  CHECK(std::chrono::steady_clock::now() - start < 500ms);
  CHECK_FALSE(second);
  CHECK(second.message() == first.message());
  CHECK_FALSE(present);
  CHECK_FALSE(c->setValue("k3", "v"));
  c.reset(); // closes the connection: the fake store's thread ends
  slow.join();
  ::close(lfd);
}

TEST_CASE("tcp store: a connection that says no hello in time is closed",
          "[comm][store]") {
  std::vector<std::string> logged;
  std::mutex logMu;
  TcpStoreLimits limits;
  limits.helloTimeout = 300ms;
  Status st;
  auto server = TcpStoreServer::start("127.0.0.1", 0, "j", 1, st, limits,
                                      [&](const std::string &line) {
                                        std::lock_guard<std::mutex> lock(logMu);
                                        logged.push_back(line);
                                      });
  REQUIRE(server);
  int fd = rawConnect(server->port());
  auto start = std::chrono::steady_clock::now();
  CHECK(readToEnd(fd) == "");
  CHECK(std::chrono::steady_clock::now() - start < 3s);
  ::close(fd);
  CHECK(waitUntil([&] { return server->openConnections() == 0; }, 5s));
  std::lock_guard<std::mutex> lock(logMu);
  REQUIRE(logged.size() == 1);
  CHECK(logged[0].find("that said no hello within 300 ms") !=
        std::string::npos);
}

TEST_CASE("tcp store: a rank that a store keeps closing on is told so",
          "[comm][store]") {
  // Not a store: it accepts and closes every connection at once.
  int listener = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(listener >= 0);
  sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(listener, reinterpret_cast<sockaddr *>(&addr), sizeof(addr)) ==
          0);
  REQUIRE(::listen(listener, 16) == 0);
  socklen_t len = sizeof(addr);
  REQUIRE(::getsockname(listener, reinterpret_cast<sockaddr *>(&addr), &len) ==
          0);
  std::atomic<bool> stop{false};
  std::thread closer([&] {
    while (!stop) {
      pollfd p = {listener, POLLIN, 0};
      if (::poll(&p, 1, 20) == 1) {
        int fd = ::accept(listener, nullptr, nullptr);
        if (fd >= 0)
          ::close(fd);
      }
    }
  });
  Status st;
  CHECK_FALSE(
      TcpStore::connect("127.0.0.1", ntohs(addr.sin_port), "j", 0, 1, 1s, st));
  stop = true;
  closer.join();
  ::close(listener);
  CHECK(st.message().find("did not admit rank 0 within 1 s (the store closed "
                          "the connection without answering its hello)") !=
        std::string::npos);
}

TEST_CASE("tcp store: a joined rank's request over the limit is refused",
          "[comm][store]") {
  TcpStoreLimits limits;
  limits.maxMessage = 1024;
  Status st;
  auto server = TcpStoreServer::start("127.0.0.1", 0, "j", 1, st, limits);
  REQUIRE(server);
  auto c = TcpStore::connect("127.0.0.1", server->port(), "j", 0, 1, 5s, st);
  REQUIRE(c);
  REQUIRE(c->setValue("small", std::string(100, 'x')));
  Status big = c->setValue("big", std::string(2000, 'x'));
  CHECK_FALSE(big);
  CHECK(big.message().find("a request of 2012 bytes (at most 1024)") !=
        std::string::npos);
}

TEST_CASE("tcp store: refusals are logged a few at a time", "[comm][store]") {
  std::vector<std::string> logged;
  std::mutex logMu;
  Status st;
  auto server =
      TcpStoreServer::start("127.0.0.1", 0, "j", 1, st, TcpStoreLimits(),
                            [&](const std::string &line) {
                              std::lock_guard<std::mutex> lock(logMu);
                              logged.push_back(line);
                            });
  REQUIRE(server);
  for (int i = 0; i < 30; ++i)
    CHECK_FALSE(
        TcpStore::connect("127.0.0.1", server->port(), "k", 0, 1, 5s, st));
  CHECK(server->refusedConnections() == 30);
  std::lock_guard<std::mutex> lock(logMu);
  CHECK(logged.size() == 5);
}

TEST_CASE("gloo communicators meet through the tcp store", "[comm][store]") {
  const int world = 3;
  auto server = serve("gloo-job", world);
  std::vector<std::string> errors(world);
  std::vector<float> sums(world, 0);
  std::vector<std::thread> ranks;
  for (int r = 0; r < world; ++r)
    ranks.emplace_back([&, r] {
      Status st;
      auto store = TcpStore::connect("127.0.0.1", server->port(), "gloo-job", r,
                                     world, 10s, st);
      if (!store) {
        errors[r] = st.message();
        return;
      }
      auto comm = createGlooCommunicator(r, world, store, 10s, st, "127.0.0.1");
      if (!comm) {
        errors[r] = st.message();
        return;
      }
      st = comm->connect({CommKey{"s", {0, 1, 2}}});
      float v = float(r + 1);
      if (st)
        st = comm->allReduceSum("s", {0, 1, 2}, &v, 1);
      errors[r] = st ? "" : st.message();
      sums[r] = v;
    });
  for (std::thread &t : ranks)
    t.join();
  for (int r = 0; r < world; ++r) {
    INFO("rank " << r << ": " << errors[r]);
    CHECK(errors[r] == "");
    CHECK(sums[r] == 6.0f);
  }
}
