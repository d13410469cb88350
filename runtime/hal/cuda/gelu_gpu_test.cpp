// The CUDA gelu kernel on a GPU (tag gpu), through the device's registry,
// against the same math on the host (GeluMath.h, itself checked against the
// CPU kernel by gelu_math_test), on several sizes including odd ones.
#include <catch2/catch.hpp>

#include <cmath>
#include <random>
#include <vector>

#include "runtime/hal/cuda/CudaBackend.h"
#include "runtime/hal/cuda/GeluMath.h"

using namespace piper::runtime;
using namespace piper::runtime::hal;

TEST_CASE("the CUDA gelu kernel matches its host math", "[cuda][gpu][gelu]") {
  Status st;
  auto device = createCudaDevice(0, nullptr, st);
  INFO(st.message());
  REQUIRE(device);
  const KernelInfo *gelu = device->findKernel("gelu");
  REQUIRE(gelu);
  piper::plan::Kernel kernel;
  kernel.set_op("gelu");
  KernelContext ctx;
  Allocator &a = device->allocator();
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  auto stream = device->createStream("compute");
  for (int64_t n : {1, 7, 1001, 65537, (1 << 22) + 5}) {
    std::vector<float> x(n), y(n, -1.0f);
    for (float &v : x)
      v = normal(rng);
    auto *arena = static_cast<float *>(a.allocate(2 * n * sizeof(float)));
    REQUIRE(arena);
    a.copyFromHost(arena, x.data(), n * sizeof(float));
    std::vector<TensorRef> ins{{piper::plan::F32, {n}, arena}};
    std::vector<TensorRef> outs{{piper::plan::F32, {n}, arena + n}};
    Status run;
    stream->enqueue([&] {
      run = device->runKernel(*gelu, kernel, ins, outs, ctx);
      if (run)
        a.copyToHost(y.data(), arena + n, n * sizeof(float));
    });
    stream->synchronize();
    INFO(run.message());
    REQUIRE(run);
    for (int64_t i = 0; i < n; ++i) {
      float host = cudamath::geluForward(x[i]);
      // expf on the GPU is within 2 ulp of the host's.
      INFO("n " << n << ", x[" << i << "] = " << x[i]);
      REQUIRE(std::fabs(y[i] - host) <=
              1e-6f * std::fabs(host) + 1e-7f * std::fabs(x[i]) + 1e-30f);
    }
    a.deallocate(arena, 2 * n * sizeof(float));
  }
}
