// Multi-process tests of the Gloo communicator: every rank is a forked child
// that reports through its exit code, and the parent kills stragglers.
#include "runtime/comm/test_ranks.h"

namespace piper::runtime {
namespace {

using namespace testranks;

/// The byte `index` of the message with `tag` from `src` to `dst`.
uint8_t pattern(int src, int dst, uint32_t tag, size_t index) {
  return static_cast<uint8_t>(src * 31 + dst * 7 + tag * 13 + index);
}

long long millisSince(Clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() -
                                                               start)
      .count();
}

TEST_CASE("send and recv between every pair of ranks", "[comm]") {
  constexpr int kWorld = 3;
  const std::vector<size_t> sizes = {0, 1, 1000, 65536, (1 << 20) + 3};
  auto codes = runRanks(kWorld, 15s, [&](int rank, const std::string &dir) {
    auto comm = makeComm(rank, kWorld, dir, 5000ms);
    CHILD_CHECK(comm);
    std::vector<CommKey> keys;
    for (int peer = 0; peer < kWorld; ++peer)
      if (peer != rank)
        keys.push_back({"p2p", {peer, rank}}); // unsorted on purpose
    CHILD_OK(comm->connect(keys));

    // Every message to every peer is in flight before any is received.
    std::vector<std::vector<uint8_t>> outgoing;
    for (int peer = 0; peer < kWorld; ++peer) {
      if (peer == rank)
        continue;
      for (uint32_t tag = 0; tag < sizes.size(); ++tag) {
        std::vector<uint8_t> msg(sizes[tag]);
        for (size_t i = 0; i < msg.size(); ++i)
          msg[i] = pattern(rank, peer, tag, i);
        outgoing.push_back(std::move(msg));
        CHILD_OK(comm->send("p2p", outgoing.back().data(),
                            outgoing.back().size(), peer, tag));
      }
    }
    // Receives in the reverse tag order, so messages match by tag.
    for (int peer = 0; peer < kWorld; ++peer) {
      if (peer == rank)
        continue;
      for (uint32_t tag = sizes.size(); tag-- > 0;) {
        std::vector<uint8_t> msg(sizes[tag], 0xee);
        CHILD_OK(comm->recv("p2p", msg.data(), msg.size(), peer, tag));
        for (size_t i = 0; i < msg.size(); ++i)
          CHILD_CHECK(msg[i] == pattern(peer, rank, tag, i));
      }
    }
    CHILD_OK(comm->waitSends("p2p"));
    return 0;
  });
  requireAllPassed(codes);
}

TEST_CASE("all-reduce over subgroups and the world", "[comm]") {
  constexpr int kWorld = 4;
  auto codes = runRanks(kWorld, 15s, [&](int rank, const std::string &dir) {
    auto comm = makeComm(rank, kWorld, dir, 5000ms);
    CHILD_CHECK(comm);
    const std::vector<int> all = {0, 1, 2, 3};
    // Even ranks and odd ranks form two subgroups on the same stream.
    const std::vector<int> half =
        rank % 2 == 0 ? std::vector<int>{0, 2} : std::vector<int>{3, 1};
    CHILD_OK(comm->connect({{"dp", all}, {"dp", half}, {"solo", {rank}}}));

    for (int step = 0; step < 3; ++step) {
      for (size_t count : {size_t(1), size_t(1000), size_t(300000)}) {
        std::vector<float> data(count);
        for (size_t i = 0; i < count; ++i)
          data[i] = static_cast<float>(rank + 1 + step + i % 7);
        CHILD_OK(comm->allReduceSum("dp", all, data.data(), count));
        for (size_t i = 0; i < count; ++i)
          CHILD_CHECK(data[i] == static_cast<float>(10 + 4 * (step + i % 7)));
      }

      std::vector<float> part(5000);
      for (size_t i = 0; i < part.size(); ++i)
        part[i] = static_cast<float>(rank * 10 + i);
      CHILD_OK(comm->allReduceSum("dp", half, part.data(), part.size()));
      float base = rank % 2 == 0 ? 20.0f : 40.0f; // 0 + 20 or 10 + 30
      for (size_t i = 0; i < part.size(); ++i)
        CHILD_CHECK(part[i] == base + 2.0f * i);

      float mine[2] = {1.5f, static_cast<float>(rank)};
      CHILD_OK(comm->allReduceSum("solo", {rank}, mine, 2));
      CHILD_CHECK(mine[0] == 1.5f && mine[1] == rank);

      double metrics[3] = {static_cast<double>(rank), 0.25, 1e10 + rank};
      CHILD_OK(comm->allReduceSumWorld(metrics, 3));
      CHILD_CHECK(metrics[0] == 6.0);
      CHILD_CHECK(metrics[1] == 1.0);
      CHILD_CHECK(metrics[2] == 4e10 + 6.0);
    }
    return 0;
  });
  requireAllPassed(codes);
}

TEST_CASE("two streams are used concurrently from two threads", "[comm]") {
  constexpr int kWorld = 2;
  auto codes = runRanks(kWorld, 15s, [&](int rank, const std::string &dir) {
    auto comm = makeComm(rank, kWorld, dir, 5000ms);
    CHILD_CHECK(comm);
    CHILD_OK(comm->connect({{"a", {0, 1}}, {"b", {0, 1}}}));
    int peer = 1 - rank;

    auto exchange = [&](const std::string &stream, int streamId) -> int {
      for (uint32_t step = 0; step < 50; ++step) {
        std::vector<int> out(256), in(256, -1);
        auto expected = [&](int src, size_t i) {
          return static_cast<int>(streamId * 100000 + src * 10000 + step * 100 +
                                  i % 100);
        };
        for (size_t i = 0; i < out.size(); ++i)
          out[i] = expected(rank, i);
        CHILD_OK(comm->send(stream, out.data(), out.size() * sizeof(int), peer,
                            step));
        CHILD_OK(
            comm->recv(stream, in.data(), in.size() * sizeof(int), peer, step));
        CHILD_OK(comm->waitSends(stream));
        for (size_t i = 0; i < in.size(); ++i)
          CHILD_CHECK(in[i] == expected(peer, i));
        float sum[1] = {static_cast<float>(streamId + rank)};
        CHILD_OK(comm->allReduceSum(stream, {0, 1}, sum, 1));
        CHILD_CHECK(sum[0] == 2.0f * streamId + 1.0f);
      }
      return 0;
    };
    std::atomic<int> resultB{-1};
    std::thread other([&] { resultB = exchange("b", 2); });
    int resultA = exchange("a", 1);
    other.join();
    CHILD_CHECK(resultA == 0 && resultB == 0);
    return 0;
  });
  requireAllPassed(codes);
}

TEST_CASE("a peer that exits makes operations with it fail promptly",
          "[comm]") {
  constexpr int kWorld = 3;
  auto codes = runRanks(kWorld, 15s, [&](int rank, const std::string &dir) {
    auto comm = makeComm(rank, kWorld, dir, 5000ms);
    CHILD_CHECK(comm);
    std::vector<CommKey> keys = {{"dp", {0, 1, 2}}};
    if (rank != 1)
      keys.push_back({"pp", {0, 2}});
    CHILD_OK(comm->connect(keys));
    double barrier[1] = {1.0};
    CHILD_OK(comm->allReduceSumWorld(barrier, 1));
    if (rank == 2)
      _exit(0); // dies without sending what rank 0 waits for

    auto start = Clock::now();
    if (rank == 0) {
      std::vector<char> buf(64);
      Status status = comm->recv("pp", buf.data(), buf.size(), 2, 7);
      CHILD_FAILS_WITH(status,
                       "rank 0: recv from rank 2 on stream 'pp' failed");
      std::fprintf(stderr, "(expected) %s\n", status.message().c_str());
      CHILD_FAILS_WITH(comm->recv("pp", buf.data(), buf.size(), 2, 8),
                       "is unusable after an earlier error");
    }
    float data[4] = {1, 2, 3, 4};
    Status status = comm->allReduceSum("dp", {0, 1, 2}, data, 4);
    CHILD_FAILS_WITH(status, "rank " + std::to_string(rank) +
                                 ": all-reduce over ranks [0,1,2] on stream "
                                 "'dp' failed");
    std::fprintf(stderr, "(expected) %s\n", status.message().c_str());
    CHILD_CHECK(millisSince(start) < 3000); // well before the 5 s timeout
    return 0;
  });
  requireAllPassed(codes);
}

TEST_CASE("recv and waitSends without a partner time out", "[comm]") {
  constexpr int kWorld = 2;
  auto codes = runRanks(kWorld, 15s, [&](int rank, const std::string &dir) {
    auto comm = makeComm(rank, kWorld, dir, 1000ms);
    CHILD_CHECK(comm);
    CHILD_OK(comm->connect({{"pp", {0, 1}}, {"q", {0, 1}}}));
    auto start = Clock::now();
    if (rank == 0) {
      // Rank 1 never sends on "pp".
      int value = 0;
      Status status = comm->recv("pp", &value, sizeof(value), 1, 3);
      CHILD_FAILS_WITH(status,
                       "rank 0: recv from rank 1 on stream 'pp' failed");
      CHILD_FAILS_WITH(status, "timed out");
      std::fprintf(stderr, "(expected) %s\n", status.message().c_str());
    } else {
      // Rank 0 never receives on "q".
      int value = 42;
      CHILD_OK(comm->send("q", &value, sizeof(value), 0, 3));
      Status status = comm->waitSends("q");
      CHILD_FAILS_WITH(status, "rank 1: send to rank 0 on stream 'q' failed");
      CHILD_FAILS_WITH(status, "timed out");
      std::fprintf(stderr, "(expected) %s\n", status.message().c_str());
    }
    long long waited = millisSince(start);
    CHILD_CHECK(waited >= 900 && waited < 3000);
    // The world control connection is unaffected; it doubles as a barrier so
    // that neither rank exits while the other still waits.
    double one[1] = {1.0};
    CHILD_OK(comm->allReduceSumWorld(one, 1));
    CHILD_CHECK(one[0] == 2.0);
    return 0;
  });
  requireAllPassed(codes);
}

TEST_CASE("invalid keys and unconnected operations are rejected", "[comm]") {
  constexpr int kWorld = 2;
  auto codes = runRanks(kWorld, 15s, [&](int rank, const std::string &dir) {
    Status status;
    CHILD_CHECK(!createGlooCommunicator(rank, kWorld, dir + "/missing", 1000ms,
                                        status));
    CHILD_FAILS_WITH(status, "does not exist");
    CHILD_CHECK(!createGlooCommunicator(kWorld, kWorld, dir, 1000ms, status));
    CHILD_FAILS_WITH(status, "outside the world");

    auto comm = makeComm(rank, kWorld, dir, 2000ms);
    CHILD_CHECK(comm);
    int other = 1 - rank;
    // Rejected before meeting anyone, so these return at once.
    CHILD_FAILS_WITH(
        comm->connect({{"pp", {0, 1}}, {"x", {other}}}),
        "rank " + std::to_string(rank) + ": connecting communicator 'x[" +
            std::to_string(other) + "]' failed: it does not contain this rank");
    CHILD_FAILS_WITH(comm->connect({{"x", {0, 1, 1}}}), "lists a rank twice");
    CHILD_FAILS_WITH(comm->connect({{"x", {0, 2}}}), "outside the world");

    CHILD_OK(comm->connect({{"pp", {0, 1}}}));
    CHILD_FAILS_WITH(comm->connect({{"pp", {0, 1}}}), "already connected");

    int value = 0;
    CHILD_FAILS_WITH(comm->send("other", &value, sizeof(value), other, 0),
                     "no communicator connected for key 'other[0,1]'");
    CHILD_FAILS_WITH(comm->recv("other", &value, sizeof(value), other, 0),
                     "no communicator connected for key 'other[0,1]'");
    CHILD_FAILS_WITH(comm->recv("pp", &value, sizeof(value), 5, 0),
                     "outside the world");
    CHILD_FAILS_WITH(comm->send("pp", &value, sizeof(value), rank, 0),
                     "the peer is this rank");
    float data[1] = {1.0f};
    CHILD_FAILS_WITH(comm->allReduceSum("dp", {0, 1}, data, 1),
                     "no communicator connected for key 'dp[0,1]'");
    CHILD_FAILS_WITH(comm->allReduceSum("pp", {rank}, data, 1),
                     "no communicator connected for key 'pp[" +
                         std::to_string(rank) + "]'");
    CHILD_OK(comm->waitSends("never-used"));

    // The connected key still works after all the rejected calls.
    CHILD_OK(comm->allReduceSum("pp", {1, 0}, data, 1));
    CHILD_CHECK(data[0] == 2.0f);
    return 0;
  });
  requireAllPassed(codes);
}

} // namespace
} // namespace piper::runtime
