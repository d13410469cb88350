// The CUDA gelu kernel's math (GeluMath.h), compiled for the host, against
// the CPU kernel on the same random inputs: runs on every machine.
#include <catch2/catch.hpp>

#include <cmath>
#include <random>
#include <vector>

#include "runtime/hal/cpu/CpuDevice.h"
#include "runtime/hal/cuda/GeluMath.h"

using namespace piper::runtime;
using namespace piper::runtime::hal;

TEST_CASE("the CUDA gelu's math matches the CPU kernel", "[cuda][gelu]") {
  auto cpu = createCpuDevice(nullptr);
  const KernelInfo *gelu = cpu->findKernel("gelu");
  REQUIRE(gelu);
  piper::plan::Kernel kernel;
  kernel.set_op("gelu");
  KernelContext ctx;
  std::mt19937 rng(9);
  for (int64_t n : {1, 7, 64, 1001, 65537}) {
    std::normal_distribution<float> normal(0.0f, 3.0f);
    std::vector<float> x(n), y(n, -1.0f);
    for (float &v : x)
      v = normal(rng);
    // The edges: zero, tiny, large of both signs, where tanh saturates.
    const float edges[] = {0.0f, 1e-30f, -1e-30f, 1e-3f, -1e-3f, 10.0f,
                           -10.0f, 40.0f, -40.0f};
    for (size_t i = 0; i < std::size(edges) && i < x.size(); ++i)
      x[i] = edges[i];
    std::vector<TensorRef> ins{{piper::plan::F32, {n}, x.data()}};
    std::vector<TensorRef> outs{{piper::plan::F32, {n}, y.data()}};
    Status st = cpu->runKernel(*gelu, kernel, ins, outs, ctx);
    REQUIRE(st);
    for (int64_t i = 0; i < n; ++i) {
      float mine = cudamath::geluForward(x[i]);
      // Both compute tanh within ~1e-7 absolute (different exp functions);
      // gelu = 0.5 x (1 + tanh) then differs by at most ~1e-7 |x| absolute,
      // besides 1e-5 relative.
      float bound = 1e-5f * std::fabs(y[i]) + 2e-7f * std::fabs(x[i]) + 1e-30f;
      INFO("n " << n << ", x[" << i << "] = " << x[i] << ": cpu " << y[i]
                << ", cuda math " << mine);
      REQUIRE(std::fabs(mine - y[i]) <= bound);
    }
  }
}
