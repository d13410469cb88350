// The NCCL communicator on a GPU (tag gpu) at world size 1: every operation
// kind, issued from a CUDA device's stream worker (on its CUDA stream, bound
// by name), in fp32 and bf16, results checked; host buffers staged;
// operations of a bound stream from another thread, and of an unbound one;
// and the error when NCCL cannot be loaded. (NCCL needs one GPU per
// rank, so a one-GPU machine runs NCCL at world size 1 only.)
#include <catch2/catch.hpp>

#include <cstdlib>
#include <cstring>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include "support/Precision.h"
#include "runtime/hal/cuda/CudaBackend.h"
#include "runtime/hal/cuda/NcclCommunicator.h"
#include "runtime/hal/cuda/NcclLibrary.h"

using namespace piper;

using namespace piper::runtime;
using namespace piper::runtime::hal;

namespace {

std::string storeDir() {
  const char *base = std::getenv("TEST_TMPDIR");
  std::string dir = std::string(base ? base : "/tmp") + "/nccl_XXXXXX";
  REQUIRE(mkdtemp(dir.data()));
  return dir;
}

struct Setup {
  std::unique_ptr<Communicator> comm;
  std::unique_ptr<Device> device;
  std::unique_ptr<Stream> stream;

  Setup() {
    Status st;
    comm = createNcclCommunicator(0, 1, 0, storeDir(),
                                  std::chrono::milliseconds(20000), st);
    INFO(st.message());
    REQUIRE(comm);
    REQUIRE(comm->connect({{"s", {0}}, {"t", {0}}}));
    device = createCudaDevice(0, comm.get(), st);
    INFO(st.message());
    REQUIRE(device);
    st = device->createStream("s", stream);
    INFO(st.message());
    REQUIRE(st);
  }
  /// Runs `body` on the stream's worker (its CUDA stream is current there)
  /// and returns its status.
  Status onStream(const std::function<Status()> &body) {
    Status result;
    stream->enqueue([&] { result = body(); });
    Status synced = stream->synchronize();
    if (result && !synced)
      result = synced;
    return result;
  }
  template <class T> T *upload(const std::vector<T> &values, size_t n = 0) {
    n = std::max(n, values.size());
    void *block = nullptr;
    REQUIRE(device->allocator().allocate(n * sizeof(T), block));
    auto *p = static_cast<T *>(block);
    REQUIRE(device->allocator().zero(p, n * sizeof(T)));
    REQUIRE(device->allocator().copyFromHost(p, values.data(),
                                             values.size() * sizeof(T)));
    owned.push_back({p, n * sizeof(T)});
    return p;
  }
  template <class T> std::vector<T> download(const T *p, size_t n) {
    std::vector<T> values(n);
    REQUIRE(device->allocator().copyToHost(values.data(), p, n * sizeof(T)));
    return values;
  }
  ~Setup() {
    for (auto &[p, bytes] : owned)
      device->allocator().deallocate(p, bytes);
  }
  std::vector<std::pair<void *, size_t>> owned;
};

float valueOf(size_t i) {
  return static_cast<float>(int(i % 23) - 11) * 0.25f; // exact in bf16
}

} // namespace

TEST_CASE("NCCL at world size 1: every collective, fp32 and bf16, on a "
          "device stream",
          "[nccl][gpu]") {
  Setup s;
  const CommKey key{"s", {0}};
  const size_t n = 1001; // odd
  std::vector<float> f(n);
  std::vector<uint16_t> b(n);
  for (size_t i = 0; i < n; ++i) {
    f[i] = valueOf(i);
    b[i] = floatToBf16(valueOf(i));
  }
  float *df = s.upload(f);
  uint16_t *db = s.upload(b);
  float *dfOut = s.upload(std::vector<float>{}, n);
  uint16_t *dbOut = s.upload(std::vector<uint16_t>{}, n);

  Status st = s.onStream([&]() -> Status {
    // The works are waited for on the stream: no host blocking.
    PIPER_RETURN_IF_ERROR(
        s.comm->allReduce(key, df, n, CommDType::F32)->wait());
    PIPER_RETURN_IF_ERROR(
        s.comm->allReduce(key, db, n, CommDType::BF16)->wait());
    return Status::ok();
  });
  INFO(st.message());
  REQUIRE(st);
  CHECK(s.download(df, n) == f);
  CHECK(s.download(db, n) == b);

  for (CommDType type : {CommDType::F32, CommDType::BF16}) {
    void *in = type == CommDType::F32 ? static_cast<void *>(df) : db;
    void *out = type == CommDType::F32 ? static_cast<void *>(dfOut) : dbOut;
    size_t bytes = n * commDTypeSize(type);
    auto check = [&](const char *what) {
      INFO(what << " " << commDTypeName(type));
      std::vector<char> want(bytes), got(bytes);
      REQUIRE(s.device->allocator().copyToHost(want.data(), in, bytes));
      REQUIRE(s.device->allocator().copyToHost(got.data(), out, bytes));
      CHECK(want == got);
      REQUIRE(s.device->allocator().zero(out, bytes));
    };
    st = s.onStream([&]() -> Status {
      return s.comm->reduceScatter(key, in, out, {n}, type)->wait();
    });
    INFO(st.message());
    REQUIRE(st);
    check("reduce-scatter");
    st = s.onStream([&]() -> Status {
      return s.comm->allGather(key, in, out, {n}, type)->wait();
    });
    INFO(st.message());
    REQUIRE(st);
    check("all-gather");
    st = s.onStream([&]() -> Status {
      return s.comm->allToAll(key, in, {n}, out, {n}, type)->wait();
    });
    INFO(st.message());
    REQUIRE(st);
    check("all-to-all");
  }
}

TEST_CASE("NCCL: host buffers are staged, and operations of an unbound "
          "stream wait on the host",
          "[nccl][gpu]") {
  Setup s;
  const CommKey key{"t", {0}}; // no HAL stream is named "t": unbound
  // Host memory on a stream (the executor's all-to-all row counts).
  std::vector<int32_t> counts = {7}, got = {0};
  Status st = s.onStream([&]() -> Status {
    return s.comm
        ->allToAll(key, counts.data(), {1}, got.data(), {1}, CommDType::I32)
        ->wait();
  });
  INFO(st.message());
  REQUIRE(st);
  CHECK(got[0] == 7);
  float flag[1] = {2.5f};
  st = s.onStream([&]() -> Status {
    return s.comm->allReduce(key, flag, 1, CommDType::F32)->wait();
  });
  REQUIRE(st);
  CHECK(flag[0] == 2.5f);

  // From this thread, unbound: issued on the communicator's own stream;
  // wait() returns when the data are there.
  std::vector<double> x = {1.0, 2.0, 3.0};
  double *dx = s.upload(x);
  st = s.comm->allReduce(key, dx, 3, CommDType::F64)->wait();
  INFO(st.message());
  REQUIRE(st);
  CHECK(s.download(dx, 3) == x);
  double world[2] = {4.0, 5.0};
  REQUIRE(s.comm->allReduceSumWorld(world, 2));
  CHECK(world[0] == 4.0);
  CHECK(world[1] == 5.0);
}

// The CUDA stream is passed explicitly: a HAL stream binds its name when
// created, and an operation of that logical stream runs on it whichever
// thread issues it; destroying the HAL stream unbinds the name.
TEST_CASE("NCCL: operations run on the CUDA stream bound to their logical "
          "stream",
          "[nccl][gpu]") {
  Setup s;
  const size_t n = 4099;
  float *d = s.upload(std::vector<float>(n, 1.5f));
  std::unique_ptr<Stream> t;
  REQUIRE(s.device->createStream("t", t));
  // From this thread, not t's worker: queued on t's CUDA stream, and wait()
  // orders t after it without blocking the host.
  Status st = s.comm->allReduce({"t", {0}}, d, n, CommDType::F32)->wait();
  INFO(st.message());
  REQUIRE(st);
  REQUIRE(t->synchronize());
  CHECK(s.download(d, n) == std::vector<float>(n, 1.5f));
  t.reset(); // unbinds "t": the communicator's own stream again
  st = s.comm->allReduce({"t", {0}}, d, n, CommDType::F32)->wait();
  INFO(st.message());
  REQUIRE(st);
  CHECK(s.download(d, n) == std::vector<float>(n, 1.5f));
}

TEST_CASE("NCCL: send and receive need a peer, not this rank", "[nccl][gpu]") {
  // The Communicator contract (and Gloo) reject a send to this rank; NCCL
  // itself allows one only grouped with its receive, which the executor's
  // separate isend/irecv calls cannot express.
  Setup s;
  float *d = s.upload(std::vector<float>(4, 1.0f));
  Status st = s.comm->isend("s", d, 16, 0, 1)->wait();
  CHECK(st.message() ==
        "rank 0: send to rank 0 on stream 's' failed: the peer is this rank");
  st = s.comm->irecv("s", d, 16, 1, 1)->wait();
  CHECK(st.message().find("the peer is outside the world of 1 ranks") !=
        std::string::npos);
  st = s.comm->allReduce({"nope", {0}}, d, 4, CommDType::F32)->wait();
  CHECK(st.message().find("no communicator connected for key 'nope[0]'") !=
        std::string::npos);
}

TEST_CASE("NCCL: PIPER_NCCL_LIBRARY pointing nowhere is a clear error",
          "[nccl][gpu]") {
  setenv("PIPER_NCCL_LIBRARY", "/nonexistent", 1);
  NcclLibrary lib;
  Status st = openNcclLibrary(lib);
  unsetenv("PIPER_NCCL_LIBRARY");
  REQUIRE_FALSE(st);
  CHECK(st.message().find("cannot load the NCCL library (libnccl.so.2): "
                          "tried '/nonexistent' (PIPER_NCCL_LIBRARY)") == 0);
}
