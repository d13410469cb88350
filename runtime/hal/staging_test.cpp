// The staging communicator over real Gloo ranks (one forked process each),
// with a CPU device's allocator as the "device" memory: every operation kind
// (uneven counts, all-to-all, send/recv, f32 and bf16), host buffers passed
// through, a device copy that fails, and a peer that fails.
#include "runtime/hal/StagingCommunicator.h"

#include <atomic>
#include <cstring>
#include <numeric>

#include "runtime/comm/test_ranks.h"
#include "runtime/hal/cpu/CpuDevice.h"
#include "support/Precision.h"

namespace piper::runtime::hal {
namespace {

using namespace testranks;

constexpr int kWorld = 3;

long long millisSince(Clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() -
                                                               start)
      .count();
}

/// Element i of rank r's contribution: exact in bf16.
float valueOf(int r, size_t i) {
  return static_cast<float>(int(r * 5 + i % 17) - 8) * 0.25f;
}

/// The CPU device's allocator, counting the staging copies; with
/// `failCopies`, host copies fail as a GPU's could.
class CountingAllocator final : public Allocator {
public:
  explicit CountingAllocator(Allocator &inner) : inner(inner) {}
  Status allocate(size_t bytes, void *&ptr) override {
    return inner.allocate(bytes, ptr);
  }
  void deallocate(void *ptr, size_t bytes) override {
    inner.deallocate(ptr, bytes);
  }
  Status zero(void *ptr, size_t bytes) override {
    return inner.zero(ptr, bytes);
  }
  Status copy(void *dst, const void *src, size_t bytes) override {
    return inner.copy(dst, src, bytes);
  }
  Status copyToHost(void *host, const void *src, size_t bytes) override {
    ++toHost;
    if (failCopies)
      return Status::error("injected device error");
    return inner.copyToHost(host, src, bytes);
  }
  Status copyFromHost(void *dst, const void *host, size_t bytes) override {
    ++fromHost;
    if (failCopies)
      return Status::error("injected device error");
    return inner.copyFromHost(dst, host, bytes);
  }
  int64_t liveBytes() const override { return inner.liveBytes(); }
  int64_t peakBytes() const override { return inner.peakBytes(); }

  std::atomic<int> toHost{0};
  std::atomic<int> fromHost{0};
  std::atomic<bool> failCopies{false};

private:
  Allocator &inner;
};

/// One rank's staging communicator over Gloo, its CPU device and device
/// buffers.
struct Rank {
  std::unique_ptr<StagingCommunicator> comm;
  std::unique_ptr<Device> device;
  std::unique_ptr<CountingAllocator> memory;
  std::vector<std::pair<void *, size_t>> owned;

  ~Rank() {
    for (auto &[ptr, bytes] : owned)
      memory->deallocate(ptr, bytes);
  }
  /// Device memory holding `values`.
  // (The CPU allocator's copies cannot fail; allocate only when out of
  // memory, which these few bytes never are.)
  template <class T> T *upload(const std::vector<T> &values) {
    size_t bytes = std::max<size_t>(1, values.size()) * sizeof(T);
    void *ptr = nullptr;
    (void)memory->allocate(bytes, ptr);
    owned.push_back({ptr, bytes});
    (void)memory->copyFromHost(ptr, values.data(), values.size() * sizeof(T));
    return static_cast<T *>(ptr);
  }
  template <class T> std::vector<T> download(const T *ptr, size_t n) {
    std::vector<T> values(n);
    (void)memory->copyToHost(values.data(), ptr, n * sizeof(T));
    return values;
  }
};

bool makeRank(int rank, const std::string &dir, Rank &r,
              std::chrono::milliseconds timeout = 5000ms) {
  auto host = makeComm(rank, kWorld, dir, timeout);
  if (!host)
    return false;
  r.comm = std::make_unique<StagingCommunicator>(std::move(host));
  r.device = createCpuDevice(r.comm.get()); // device after its communicator
  r.memory = std::make_unique<CountingAllocator>(r.device->allocator());
  r.comm->attach(*r.memory);
  return true;
}

std::vector<CommKey> keys(int rank) {
  std::vector<CommKey> k = {{"c", {0, 1, 2}}};
  for (int peer = 0; peer < kWorld; ++peer)
    if (peer != rank)
      k.push_back({"p", {std::min(rank, peer), std::max(rank, peer)}});
  return k;
}

TEST_CASE("staging: every operation kind on device memory", "[staging]") {
  auto codes = runRanks(kWorld, 30s, [&](int rank, const std::string &dir) {
    Rank r;
    CHILD_CHECK(makeRank(rank, dir, r));
    CHILD_CHECK(r.comm->rank() == rank && r.comm->worldSize() == kWorld);
    CHILD_OK(r.comm->connect(keys(rank)));

    // all-reduce, f32 and bf16, both issued before either is waited for.
    const size_t n = 517;
    std::vector<float> f(n);
    std::vector<uint16_t> b(n);
    for (size_t i = 0; i < n; ++i) {
      f[i] = valueOf(rank, i);
      b[i] = floatToBf16(valueOf(rank, i));
    }
    float *df = r.upload(f);
    uint16_t *db = r.upload(b);
    int copiesIn = r.memory->toHost, copiesBack = r.memory->fromHost;
    CommWorkPtr wf = r.comm->allReduce({"c", {0, 1, 2}}, df, n, CommDType::F32);
    CommWorkPtr wb =
        r.comm->allReduce({"c", {0, 1, 2}}, db, n, CommDType::BF16);
    CHILD_CHECK(r.memory->toHost == copiesIn + 2); // staged at issue
    CHILD_CHECK(r.memory->fromHost == copiesBack); // copied back by wait
    CHILD_OK(wb->wait());
    CHILD_OK(wf->wait());
    CHILD_OK(wf->wait()); // twice: same status, no second copy
    CHILD_CHECK(r.memory->fromHost == copiesBack + 2);
    std::vector<float> fs = r.download(df, n);
    std::vector<uint16_t> bs = r.download(db, n);
    for (size_t i = 0; i < n; ++i) {
      float want = valueOf(0, i) + valueOf(1, i) + valueOf(2, i);
      CHILD_CHECK(fs[i] == want);
      CHILD_CHECK(bs[i] == floatToBf16(want));
    }

    // reduce-scatter with uneven counts (one member gets nothing).
    const std::vector<size_t> counts = {5, 0, 9};
    const size_t total = 14;
    std::vector<float> in(total);
    for (size_t i = 0; i < total; ++i)
      in[i] = valueOf(rank, i);
    float *din = r.upload(in);
    float *dout = r.upload(std::vector<float>(9, -7.0f));
    CHILD_OK(r.comm->reduceScatter({"c", {0, 1, 2}}, din, dout, counts,
                                   CommDType::F32)
                 ->wait());
    std::vector<float> out = r.download(dout, 9);
    size_t offset = std::accumulate(counts.begin(), counts.begin() + rank,
                                    size_t{0});
    for (size_t i = 0; i < counts[rank]; ++i)
      CHILD_CHECK(out[i] == valueOf(0, offset + i) + valueOf(1, offset + i) +
                                valueOf(2, offset + i));
    if (counts[rank] == 0)
      CHILD_CHECK(out[0] == -7.0f); // nothing written

    // all-gather with uneven pieces, bf16.
    std::vector<uint16_t> piece(counts[rank]);
    for (size_t i = 0; i < piece.size(); ++i)
      piece[i] = floatToBf16(valueOf(rank, i));
    uint16_t *dpiece = r.upload(piece);
    uint16_t *dall = r.upload(std::vector<uint16_t>(total));
    CHILD_OK(r.comm->allGather({"c", {0, 1, 2}}, dpiece, dall, counts,
                               CommDType::BF16)
                 ->wait());
    std::vector<uint16_t> all = r.download(dall, total);
    size_t at = 0;
    for (int m = 0; m < kWorld; ++m)
      for (size_t i = 0; i < counts[m]; ++i)
        CHILD_CHECK(all[at++] == floatToBf16(valueOf(m, i)));

    // all-to-all with per-peer counts: rank s sends (s + d) % 3 + 1 elements
    // to rank d, valued 100 s + 10 d + i.
    auto count = [](int s, int d) { return size_t((s + d) % 3 + 1); };
    std::vector<size_t> sendCounts(kWorld), recvCounts(kWorld);
    std::vector<float> send;
    for (int d = 0; d < kWorld; ++d) {
      sendCounts[d] = count(rank, d);
      recvCounts[d] = count(d, rank);
      for (size_t i = 0; i < sendCounts[d]; ++i)
        send.push_back(float(100 * rank + 10 * d + int(i)));
    }
    size_t recvTotal =
        std::accumulate(recvCounts.begin(), recvCounts.end(), size_t{0});
    float *dsend = r.upload(send);
    float *drecv = r.upload(std::vector<float>(recvTotal));
    CHILD_OK(r.comm->allToAll({"c", {0, 1, 2}}, dsend, sendCounts, drecv,
                              recvCounts, CommDType::F32)
                 ->wait());
    std::vector<float> recv = r.download(drecv, recvTotal);
    at = 0;
    for (int s = 0; s < kWorld; ++s)
      for (size_t i = 0; i < recvCounts[s]; ++i)
        CHILD_CHECK(recv[at++] == float(100 * s + 10 * rank + int(i)));

    // send / recv in a ring, the receive issued first and waited last.
    int next = (rank + 1) % kWorld, prev = (rank + kWorld - 1) % kWorld;
    std::vector<int32_t> mine(33), got(33);
    for (size_t i = 0; i < mine.size(); ++i)
      mine[i] = rank * 1000 + int(i);
    int32_t *dmine = r.upload(mine);
    int32_t *dgot = r.upload(std::vector<int32_t>(33));
    CommWorkPtr rw = r.comm->irecv("p", dgot, 33 * 4, prev, 3);
    CommWorkPtr sw = r.comm->isend("p", dmine, 33 * 4, next, 3);
    CHILD_OK(sw->wait());
    CHILD_OK(rw->wait());
    got = r.download(dgot, 33);
    for (size_t i = 0; i < got.size(); ++i)
      CHILD_CHECK(got[i] == prev * 1000 + int(i));

    // The world sum is host data, passed through.
    double sums[2] = {1.0, double(rank)};
    CHILD_OK(r.comm->allReduceSumWorld(sums, 2));
    CHILD_CHECK(sums[0] == 3.0 && sums[1] == 3.0);
    return 0;
  });
  requireAllPassed(codes);
}

TEST_CASE("staging: host buffers are passed through when told so",
          "[staging]") {
  auto codes = runRanks(kWorld, 20s, [&](int rank, const std::string &dir) {
    Rank r;
    CHILD_CHECK(makeRank(rank, dir, r));
    std::vector<int32_t> hostCounts(kWorld, rank + 1), hostRecv(kWorld);
    const void *hostPtrs[] = {hostCounts.data(), hostRecv.data()};
    r.comm->attach(*r.memory, [&](const void *p) {
      return p != hostPtrs[0] && p != hostPtrs[1];
    });
    CHILD_OK(r.comm->connect(keys(rank)));
    int before = r.memory->toHost + r.memory->fromHost;
    std::vector<size_t> ones(kWorld, 1);
    CHILD_OK(r.comm->allToAll({"c", {0, 1, 2}}, hostCounts.data(), ones,
                              hostRecv.data(), ones, CommDType::I32)
                 ->wait());
    CHILD_CHECK(r.memory->toHost + r.memory->fromHost == before);
    for (int s = 0; s < kWorld; ++s)
      CHILD_CHECK(hostRecv[s] == s + 1);
    return 0;
  });
  requireAllPassed(codes);
}

// A GPU's copy can fail (a CUDA error): staging the input fails the
// operation at issue, copying the result back fails its wait, each with
// the device's message, and no rank aborts.
TEST_CASE("staging: a device copy that fails is the operation's error",
          "[staging]") {
  auto codes = runRanks(kWorld, 20s, [&](int rank, const std::string &dir) {
    Rank r;
    CHILD_CHECK(makeRank(rank, dir, r));
    CHILD_OK(r.comm->connect(keys(rank)));
    float *data = r.upload(std::vector<float>{1, 2, 3, 4});

    r.memory->failCopies = true;
    CHILD_FAILS_WITH(
        r.comm->allReduce({"c", {0, 1, 2}}, data, 4, CommDType::F32)->wait(),
        "rank " + std::to_string(rank) +
            ": all-reduce over 'c[0,1,2]' failed: copying the input to the "
            "host: injected device error");
    r.memory->failCopies = false;

    // Rank 0 sends to rank 1, whose copy back to the device fails.
    if (rank == 0)
      CHILD_OK(r.comm->isend("p", data, 4 * sizeof(float), 1, 7)->wait());
    if (rank == 1) {
      CommWorkPtr recv = r.comm->irecv("p", data, 4 * sizeof(float), 0, 7);
      r.memory->failCopies = true;
      CHILD_FAILS_WITH(recv->wait(), "copying the result to the device: "
                                     "injected device error");
      r.memory->failCopies = false;
    }
    double barrier[1] = {1.0};
    CHILD_OK(r.comm->allReduceSumWorld(barrier, 1));
    return 0;
  });
  requireAllPassed(codes);
}

TEST_CASE("staging: errors of the host communicator and before attach",
          "[staging]") {
  auto codes = runRanks(kWorld, 20s, [&](int rank, const std::string &dir) {
    auto host = makeComm(rank, kWorld, dir, 5000ms);
    CHILD_CHECK(host);
    StagingCommunicator comm(std::move(host));
    float x[2] = {1, 2};
    CHILD_FAILS_WITH(
        comm.allReduce({"c", {0, 1, 2}}, x, 2, CommDType::F32)->wait(),
        "rank " + std::to_string(rank) +
            ": all-reduce over 'c[0,1,2]' failed: the staging communicator "
            "has no device memory attached");
    auto device = createCpuDevice(&comm);
    CountingAllocator memory(device->allocator());
    comm.attach(memory);
    CHILD_OK(comm.connect(keys(rank)));
    double barrier[1] = {1.0};
    CHILD_OK(comm.allReduceSumWorld(barrier, 1));
    if (rank == 2)
      _exit(0); // dies without taking part

    // The peer's failure comes back from wait(), and nothing is copied
    // back into the device buffer.
    void *block = nullptr;
    CHILD_OK(memory.allocate(4 * sizeof(float), block));
    float *data = static_cast<float *>(block);
    float init[4] = {1, 2, 3, 4};
    CHILD_OK(memory.copyFromHost(data, init, sizeof init));
    int back = memory.fromHost;
    auto start = Clock::now();
    Status status =
        comm.allReduce({"c", {0, 1, 2}}, data, 4, CommDType::F32)->wait();
    CHILD_FAILS_WITH(status, "rank " + std::to_string(rank) +
                                 ": all-reduce over ranks [0,1,2] on stream "
                                 "'c' failed");
    std::fprintf(stderr, "(expected) %s\n", status.message().c_str());
    CHILD_CHECK(memory.fromHost == back);
    float after[4];
    CHILD_OK(memory.copyToHost(after, data, sizeof after));
    CHILD_CHECK(std::memcmp(after, init, sizeof init) == 0);
    if (rank == 0) {
      std::vector<char> buf(16);
      void *dblock = nullptr;
      CHILD_OK(memory.allocate(16, dblock));
      char *dbuf = static_cast<char *>(dblock);
      CHILD_FAILS_WITH(comm.irecv("p", dbuf, 16, 2, 1)->wait(),
                       "rank 0: recv from rank 2 on stream 'p' failed");
      CHILD_FAILS_WITH(comm.irecv("p", dbuf, 16, 0, 1)->wait(),
                       "the peer is this rank");
      memory.deallocate(dbuf, 16);
    }
    CHILD_CHECK(millisSince(start) < 4000); // before the 5 s timeout
    memory.deallocate(data, 4 * sizeof(float));
    return 0;
  });
  requireAllPassed(codes);
}

} // namespace
} // namespace piper::runtime::hal
