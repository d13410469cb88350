// Tests of the TCP rendezvous store: keys, tokens, refusals, bounded waits,
// and Gloo communicators met through it (threads as ranks, loopback only).
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "runtime/comm/TcpStore.h"

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
  auto server = serve("job-a", 2);
  int port = server->port();
  Status st;
  CHECK_FALSE(TcpStore::connect("127.0.0.1", port, "job-b", 1, 2, 5s, st));
  CHECK(st.message() ==
        "the rendezvous store at 127.0.0.1:" + std::to_string(port) +
            " refused rank 1: wrong job token: this store belongs to another "
            "job (every rank of one job needs the same PIPER_JOB_TOKEN, "
            "strategy and launcher job id)");
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
