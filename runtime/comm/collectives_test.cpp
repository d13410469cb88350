// Multi-process tests of the asynchronous Communicator API over Gloo: every
// collective in f32 and bf16 with uneven per-rank counts, and isend/irecv
// completed out of order.
#include "runtime/comm/test_ranks.h"

#include <numeric>

#include "support/Precision.h"

namespace piper::runtime {
namespace {

using namespace testranks;

constexpr int kWorld = 3;

/// Element i of rank r's contribution: exact in bf16 (small integers / 4).
float valueOf(int r, size_t i) {
  return static_cast<float>(int(r * 5 + i % 17) - 8) * 0.25f;
}

std::vector<CommKey> worldKeys(int rank) {
  return {{"c", {0, 1, 2}}, {"c", {rank}}, {"s", {0, 1, 2}}};
}

TEST_CASE("allReduce sums f32 and bf16 asynchronously", "[comm]") {
  auto codes = runRanks(kWorld, 20s, [&](int rank, const std::string &dir) {
    auto comm = makeComm(rank, kWorld, dir, 5000ms);
    CHILD_CHECK(comm);
    CHILD_OK(comm->connect(worldKeys(rank)));
    const size_t n = 1003;
    std::vector<float> f(n);
    std::vector<uint16_t> b(n);
    for (size_t i = 0; i < n; ++i) {
      f[i] = valueOf(rank, i);
      b[i] = floatToBf16(valueOf(rank, i));
    }
    // Both issued before either is waited for; they complete in order.
    CommWorkPtr wf =
        comm->allReduce({"c", {2, 0, 1}}, f.data(), n, CommDType::F32);
    CommWorkPtr wb =
        comm->allReduce({"c", {0, 1, 2}}, b.data(), n, CommDType::BF16);
    CHILD_OK(wb->wait());
    CHILD_OK(wf->wait());
    CHILD_OK(wf->wait()); // waiting twice returns the same status
    for (size_t i = 0; i < n; ++i) {
      float want = valueOf(0, i) + valueOf(1, i) + valueOf(2, i);
      CHILD_CHECK(f[i] == want);
      CHILD_CHECK(b[i] == floatToBf16(want));
    }
    // One rank: the identity, complete at once.
    float solo[2] = {1.5f, 2.5f};
    CHILD_OK(comm->allReduce({"c", {rank}}, solo, 2, CommDType::F32)->wait());
    CHILD_CHECK(solo[0] == 1.5f && solo[1] == 2.5f);
    CHILD_FAILS_WITH(
        comm->allReduce({"c", {0, 1, 2}}, solo, 1, CommDType::I32)->wait(),
        "cannot sum i32");
    return 0;
  });
  requireAllPassed(codes);
}

TEST_CASE("reduceScatter with uneven counts, f32 and bf16", "[comm]") {
  auto codes = runRanks(kWorld, 20s, [&](int rank, const std::string &dir) {
    auto comm = makeComm(rank, kWorld, dir, 5000ms);
    CHILD_CHECK(comm);
    CHILD_OK(comm->connect(worldKeys(rank)));
    for (std::vector<size_t> counts :
         {std::vector<size_t>{5, 0, 9}, std::vector<size_t>{1, 1000, 3}}) {
      size_t total = std::accumulate(counts.begin(), counts.end(), size_t(0));
      size_t offset = 0;
      for (int r = 0; r < rank; ++r)
        offset += counts[r];
      std::vector<float> in(total), out(counts[rank], -1.0f);
      std::vector<uint16_t> inB(total), outB(counts[rank], 0);
      for (size_t i = 0; i < total; ++i) {
        in[i] = valueOf(rank, i);
        inB[i] = floatToBf16(in[i]);
      }
      CommWorkPtr wf = comm->reduceScatter({"c", {0, 1, 2}}, in.data(),
                                           out.data(), counts, CommDType::F32);
      CommWorkPtr wb = comm->reduceScatter(
          {"c", {0, 1, 2}}, inB.data(), outB.data(), counts, CommDType::BF16);
      CHILD_OK(wf->wait());
      CHILD_OK(wb->wait());
      for (size_t i = 0; i < counts[rank]; ++i) {
        size_t g = offset + i;
        float want = (valueOf(0, g) + valueOf(1, g)) + valueOf(2, g);
        CHILD_CHECK(out[i] == want);
        CHILD_CHECK(outB[i] == floatToBf16(want));
      }
    }
    std::vector<float> x(3);
    CHILD_FAILS_WITH(comm->reduceScatter({"c", {0, 1, 2}}, x.data(), x.data(),
                                         {1, 2}, CommDType::F32)
                         ->wait(),
                     "2 counts for 3 ranks");
    return 0;
  });
  requireAllPassed(codes);
}

TEST_CASE("allGather concatenates uneven pieces in rank order", "[comm]") {
  auto codes = runRanks(kWorld, 20s, [&](int rank, const std::string &dir) {
    auto comm = makeComm(rank, kWorld, dir, 5000ms);
    CHILD_CHECK(comm);
    CHILD_OK(comm->connect(worldKeys(rank)));
    const std::vector<size_t> counts = {4, 0, 70001};
    std::vector<int32_t> in(counts[rank]);
    for (size_t i = 0; i < in.size(); ++i)
      in[i] = int32_t(rank * 1000000 + i);
    std::vector<int32_t> out(counts[0] + counts[1] + counts[2], -1);
    std::vector<uint16_t> inB(counts[rank], uint16_t(rank + 1)),
        outB(out.size(), 0);
    CommWorkPtr w = comm->allGather({"s", {0, 1, 2}}, in.data(), out.data(),
                                    counts, CommDType::I32);
    CommWorkPtr wb = comm->allGather({"s", {0, 1, 2}}, inB.data(), outB.data(),
                                     counts, CommDType::BF16);
    CHILD_OK(w->wait());
    CHILD_OK(wb->wait());
    size_t at = 0;
    for (int r = 0; r < kWorld; ++r)
      for (size_t i = 0; i < counts[r]; ++i, ++at) {
        CHILD_CHECK(out[at] == int32_t(r * 1000000 + i));
        CHILD_CHECK(outB[at] == uint16_t(r + 1));
      }
    return 0;
  });
  requireAllPassed(codes);
}

TEST_CASE("allToAll with per-peer counts", "[comm]") {
  auto codes = runRanks(kWorld, 20s, [&](int rank, const std::string &dir) {
    auto comm = makeComm(rank, kWorld, dir, 5000ms);
    CHILD_CHECK(comm);
    CHILD_OK(comm->connect(worldKeys(rank)));
    // Rank s sends (s + 2 * d) % 4 elements to rank d, including none.
    auto count = [](int s, int d) { return size_t((s + 2 * d) % 4); };
    std::vector<size_t> sendCounts, recvCounts;
    for (int p = 0; p < kWorld; ++p) {
      sendCounts.push_back(count(rank, p));
      recvCounts.push_back(count(p, rank));
    }
    std::vector<float> in,
        out(std::accumulate(recvCounts.begin(), recvCounts.end(), size_t(0)));
    for (int d = 0; d < kWorld; ++d)
      for (size_t i = 0; i < sendCounts[d]; ++i)
        in.push_back(float(rank * 100 + d * 10 + int(i)));
    CHILD_OK(comm->allToAll({"c", {0, 1, 2}}, in.data(), sendCounts, out.data(),
                            recvCounts, CommDType::F32)
                 ->wait());
    size_t at = 0;
    for (int s = 0; s < kWorld; ++s)
      for (size_t i = 0; i < recvCounts[s]; ++i)
        CHILD_CHECK(out[at++] == float(s * 100 + rank * 10 + int(i)));
    return 0;
  });
  requireAllPassed(codes);
}

TEST_CASE("isend and irecv complete in any wait order", "[comm]") {
  auto codes = runRanks(2, 20s, [&](int rank, const std::string &dir) {
    auto comm = makeComm(rank, 2, dir, 5000ms);
    CHILD_CHECK(comm);
    CHILD_OK(comm->connect({{"p", {0, 1}}}));
    int peer = 1 - rank;
    const int kMessages = 4;
    std::vector<std::vector<uint16_t>> out(kMessages), in(kMessages);
    std::vector<CommWorkPtr> works;
    for (int m = 0; m < kMessages; ++m) {
      out[m].assign(100 + m * 1000, uint16_t(rank * 10 + m));
      in[m].assign(out[m].size(), 0);
      works.push_back(
          comm->irecv("p", in[m].data(), in[m].size() * 2, peer, uint32_t(m)));
    }
    for (int m = kMessages - 1; m >= 0; --m)
      works.push_back(comm->isend("p", out[m].data(), out[m].size() * 2, peer,
                                  uint32_t(m)));
    for (auto it = works.rbegin(); it != works.rend(); ++it)
      CHILD_OK((*it)->wait());
    for (int m = 0; m < kMessages; ++m)
      for (uint16_t v : in[m])
        CHILD_CHECK(v == uint16_t(peer * 10 + m));
    CHILD_FAILS_WITH(comm->isend("q", out[0].data(), 2, peer, 0)->wait(),
                     "no communicator connected for key 'q[0,1]'");
    return 0;
  });
  requireAllPassed(codes);
}

} // namespace
} // namespace piper::runtime
