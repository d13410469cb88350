// Shared helpers of the CPU kernel tests (kernels_test.cpp and its
// siblings, one per group of kernel files): owning tensors, kernel
// builders, runners, seeded random operands and finite-difference
// gradient checks.
#ifndef PIPER_RUNTIME_KERNELS_KERNELS_TEST_UTIL_H
#define PIPER_RUNTIME_KERNELS_KERNELS_TEST_UTIL_H

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "runtime/kernels/AttentionChecks.h"
#include "runtime/kernels/KernelUtil.h"
#include "runtime/kernels/Kernels.h"
#include "support/Precision.h"

using namespace piper;
using namespace piper::runtime;

namespace kerneltest {

/// An owning tensor for tests.
struct Tensor {
  plan::DType dtype = plan::F32;
  std::vector<int64_t> shape;
  std::vector<float> f;
  std::vector<int32_t> i;

  static Tensor f32(std::vector<int64_t> shape,
                    std::vector<float> values = {}) {
    Tensor t;
    t.shape = std::move(shape);
    t.f = std::move(values);
    if (t.f.empty())
      t.f.assign(t.numel(), 0.0f);
    REQUIRE(int64_t(t.f.size()) == t.numel());
    return t;
  }
  static Tensor i32(std::vector<int64_t> shape, std::vector<int32_t> values) {
    Tensor t;
    t.dtype = plan::I32;
    t.shape = std::move(shape);
    t.i = std::move(values);
    REQUIRE(int64_t(t.i.size()) == t.numel());
    return t;
  }
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape)
      n *= d;
    return n;
  }
  TensorRef ref() {
    TensorRef r;
    r.dtype = dtype;
    r.shape = shape;
    r.data = dtype == plan::I32 ? static_cast<void *>(i.data())
                                : static_cast<void *>(f.data());
    return r;
  }
};

/// Builds a plan::Kernel: K("attention").i("heads", 2).f("eps", 1e-5).
struct K {
  plan::Kernel kernel;
  explicit K(const std::string &op) { kernel.set_op(op); }
  K &i(const std::string &name, int64_t v) {
    (*kernel.mutable_attrs())[name].set_i(v);
    return *this;
  }
  K &f(const std::string &name, double v) {
    (*kernel.mutable_attrs())[name].set_f(v);
    return *this;
  }
  K &s(const std::string &name, const std::string &v) {
    (*kernel.mutable_attrs())[name].set_s(v);
    return *this;
  }
  operator const plan::Kernel &() const { return kernel; }
};

inline Status run(const plan::Kernel &kernel, std::vector<Tensor> &ins,
                  std::vector<Tensor> &outs, KernelContext &ctx) {
  std::vector<TensorRef> inRefs, outRefs;
  for (Tensor &t : ins)
    inRefs.push_back(t.ref());
  for (Tensor &t : outs)
    outRefs.push_back(t.ref());
  return runKernel(kernel, inRefs, outRefs, ctx);
}

inline Status run(const plan::Kernel &kernel, std::vector<Tensor> &ins,
                  std::vector<Tensor> &outs) {
  KernelContext ctx;
  return run(kernel, ins, outs, ctx);
}

/// Runs a kernel that must succeed.
inline void mustRun(const plan::Kernel &kernel, std::vector<Tensor> &ins,
                    std::vector<Tensor> &outs) {
  Status s = run(kernel, ins, outs);
  INFO(kernel.op() << ": " << s.message());
  REQUIRE(s.isOk());
}

/// Runs a kernel that must fail with an error naming its op.
inline std::string mustFail(const plan::Kernel &kernel, std::vector<Tensor> ins,
                            std::vector<Tensor> outs = {}) {
  Status s = run(kernel, ins, outs);
  INFO(kernel.op());
  REQUIRE_FALSE(s.isOk());
  CHECK(s.message().rfind(kernel.op() + ": ", 0) == 0);
  CHECK(s.message().back() != '.');
  return s.message();
}

/// Deterministic uniform numbers in [lo, hi) (splitmix64), the same on every
/// standard library.
struct Rng {
  uint64_t state;
  explicit Rng(uint64_t seed) : state(seed) {}
  double next() {
    uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    z ^= z >> 31;
    return double(z >> 11) * 0x1p-53;
  }
  float uniform(double lo, double hi) { return float(lo + (hi - lo) * next()); }
  std::vector<float> vec(int64_t n, double lo = -1.0, double hi = 1.0) {
    std::vector<float> v(n);
    for (float &x : v)
      x = uniform(lo, hi);
    return v;
  }
};

inline Tensor randomF32(Rng &rng, std::vector<int64_t> shape, double lo = -1.0,
                        double hi = 1.0) {
  Tensor t = Tensor::f32(std::move(shape));
  t.f = rng.vec(t.numel(), lo, hi);
  return t;
}

/// L = sum(y * r) over output `which` of the forward kernel, whose outputs
/// are shaped like `outs`, in double.
inline double probeLoss(const plan::Kernel &forward, std::vector<Tensor> ins,
                        std::vector<Tensor> outs, size_t which,
                        const std::vector<float> &r) {
  Status s = run(forward, ins, outs);
  if (!s.isOk())
    FAIL(s.message());
  double loss = 0;
  for (size_t e = 0; e < r.size(); ++e)
    loss += double(outs[which].f[e]) * r[e];
  return loss;
}

/// Compares `analytic` = dL/d(ins[wrt]) with central differences of
/// probeLoss on output `which` of a forward whose outputs are shaped like
/// `outs`, element by element. The forward runs in fp32, so the step is
/// large (1e-2) and |fd - analytic| <= atol + rtol |fd|; observed errors are
/// below 3e-5, so a wrong term of any size that matters fails.
inline void
checkGradientOf(const plan::Kernel &forward, std::vector<Tensor> ins,
                size_t wrt, const std::vector<Tensor> &outs, size_t which,
                const std::vector<float> &r, const std::vector<float> &analytic,
                double step = 1e-2, double atol = 2e-4, double rtol = 1e-3) {
  REQUIRE(analytic.size() == ins[wrt].f.size());
  double worst = 0, worstFd = 0, worstAnalytic = 0;
  size_t worstAt = 0;
  bool ok = true;
  for (size_t e = 0; e < analytic.size(); ++e) {
    float orig = ins[wrt].f[e];
    float plus = orig + float(step), minus = orig - float(step);
    ins[wrt].f[e] = plus;
    double lossPlus = probeLoss(forward, ins, outs, which, r);
    ins[wrt].f[e] = minus;
    double lossMinus = probeLoss(forward, ins, outs, which, r);
    ins[wrt].f[e] = orig;
    double fd = (lossPlus - lossMinus) / (double(plus) - double(minus));
    double err = std::fabs(fd - analytic[e]);
    if (err > atol + rtol * std::fabs(fd))
      ok = false;
    if (err > worst) {
      worst = err;
      worstAt = e;
      worstFd = fd;
      worstAnalytic = analytic[e];
    }
  }
  INFO(forward.op() << " input " << wrt << " output " << which
                    << ": worst element " << worstAt << " finite difference "
                    << worstFd << " analytic " << worstAnalytic << " error "
                    << worst);
  CHECK(ok);
}

/// checkGradientOf for a forward kernel with the single output y[outShape].
inline void checkGradient(const plan::Kernel &forward, std::vector<Tensor> ins,
                          size_t wrt, const std::vector<int64_t> &outShape,
                          const std::vector<float> &r,
                          const std::vector<float> &analytic,
                          double step = 1e-2, double atol = 2e-4,
                          double rtol = 1e-3) {
  checkGradientOf(forward, std::move(ins), wrt, {Tensor::f32(outShape)}, 0, r,
                  analytic, step, atol, rtol);
}

/// attention's outputs: y [rows, width] and lse [rows, 2 heads].
inline std::vector<Tensor> attentionOuts(int64_t rows, int64_t width,
                                         int64_t heads) {
  return {Tensor::f32({rows, width}), Tensor::f32({rows, 2 * heads})};
}

/// The gradients these tests compare must not be trivially zero.
inline void requireNonZero(const std::vector<float> &g) {
  double norm = 0;
  for (float v : g)
    norm += std::fabs(v);
  REQUIRE(norm > 1e-3);
}

} // namespace kerneltest

using namespace kerneltest;

#endif // PIPER_RUNTIME_KERNELS_KERNELS_TEST_UTIL_H
