// attention_bench: times Piper's causal bf16 attention kernels (`attention`
// and `attention_grad`, as a bf16 plan calls them) on one device, for
// scripts/gpu_perf.sh's attention row (docs/gpu.md):
//
//   attention_bench --shape B,Hq,Hkv,T,D [--mode simt|cudnn] [--iters N]
//       [--backend cuda|cuda-emulation] [--rope-theta THETA]
//
// --mode cudnn runs the fused path (cuDNN's flash attention on cuda, its
// host model on cuda-emulation) and fails when it cannot; simt the warp-per-
// row kernels. Random bf16-valued operands; one warm-up call of each kernel
// (it also builds cuDNN's plans), then N timed calls of each. The device's
// calls here are off-stream, so each returns when its work is done: the
// times are host-measured per call, synchronization included (~10 us).
// Prints one JSON line {"fwd_ms": ..., "bwd_ms": ...} (means; bwd_ms the
// backward kernel alone); exit status 1 with the reason on stderr when the
// kernels cannot run.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "runtime/hal/Backends.h"
#include "support/Precision.h"

using namespace piper;
using namespace piper::runtime;

namespace {

int fail(const std::string &why) {
  fmt::print(stderr, "attention_bench: {}\n", why);
  return 1;
}

plan::AttrValue intAttr(int64_t v) {
  plan::AttrValue a;
  a.set_i(v);
  return a;
}

} // namespace

int main(int argc, char **argv) {
  std::string shapeText, mode = "simt", backend = "cuda";
  int iters = 20;
  double ropeTheta = 0;
  CLI::App app{"attention_bench: times Piper's causal bf16 attention kernels",
               "attention_bench"};
  app.add_option("--shape", shapeText, "B,Hq,Hkv,T,D")->required();
  app.add_option("--mode", mode, "simt or cudnn")
      ->check(CLI::IsMember({"simt", "cudnn"}))
      ->capture_default_str();
  app.add_option("--iters", iters, "timed calls of each kernel")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  app.add_option("--backend", backend, "cuda or cuda-emulation")
      ->check(CLI::IsMember({"cuda", "cuda-emulation"}))
      ->capture_default_str();
  app.add_option("--rope-theta", ropeTheta,
                 "rotary embeddings' theta (0: none, as torch's SDPA)")
      ->check(CLI::NonNegativeNumber);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError &e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  std::vector<int64_t> s;
  std::stringstream in(shapeText);
  for (std::string part; std::getline(in, part, ',');) {
    char *end = nullptr;
    long long v = std::strtoll(part.c_str(), &end, 10);
    if (part.empty() || *end || v < 1 || v > (1 << 20))
      return fail("--shape: '" + shapeText + "' is not B,Hq,Hkv,T,D");
    s.push_back(v);
  }
  if (s.size() != 5)
    return fail("--shape: '" + shapeText + "' is not B,Hq,Hkv,T,D");
  const int64_t b = s[0], hq = s[1], hkv = s[2], t = s[3], d = s[4];
  const int64_t rows = b * t, cols = (hq + 2 * hkv) * d, yCols = hq * d;

  hal::DeviceOptions options;
  // The command line admits only these names (CLI::IsMember above).
  options.attention = *hal::parseAttentionChoice(mode);
  hal::DeviceKind kind = *hal::parseDeviceKind(backend);
  hal::DeviceFactory factory;
  Status st = hal::createDevice(kind, 0, nullptr, nullptr, factory, options);
  if (!st)
    return fail(st.message());
  std::unique_ptr<hal::Device> device = factory(nullptr);
  if (!device)
    return fail("cannot create the " + backend + " device");

  // Operands: bf16 values, as a bf16 plan's executor hands them over.
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  auto random = [&](int64_t n) {
    std::vector<float> v(static_cast<size_t>(n));
    for (float &x : v)
      x = bf16ToFloat(floatToBf16(normal(rng)));
    return v;
  };
  hal::Allocator &memory = device->allocator();
  std::vector<std::pair<void *, size_t>> blocks;
  auto upload = [&](const std::vector<float> &host, int64_t n,
                    void *&ptr) -> Status {
    PIPER_RETURN_IF_ERROR(memory.allocate(size_t(n) * 4, ptr));
    blocks.emplace_back(ptr, size_t(n) * 4);
    if (!host.empty())
      return memory.copyFromHost(ptr, host.data(), size_t(n) * 4);
    return memory.zero(ptr, size_t(n) * 4);
  };
  void *qkv = nullptr, *y = nullptr, *lse = nullptr, *dy = nullptr,
       *dqkv = nullptr;
  st = upload(random(rows * cols), rows * cols, qkv);
  if (st)
    st = upload({}, rows * yCols, y);
  if (st)
    st = upload({}, rows * 2 * hq, lse);
  if (st)
    st = upload(random(rows * yCols), rows * yCols, dy);
  if (st)
    st = upload({}, rows * cols, dqkv);
  if (!st)
    return fail(st.message());

  auto kernelOf = [&](const char *op) {
    plan::Kernel k;
    k.set_op(op);
    (*k.mutable_attrs())["heads"] = intAttr(hq);
    (*k.mutable_attrs())["kv_heads"] = intAttr(hkv);
    (*k.mutable_attrs())["seq"] = intAttr(t);
    if (ropeTheta > 0) {
      plan::AttrValue theta;
      theta.set_f(ropeTheta);
      (*k.mutable_attrs())["rope_theta"] = theta;
    }
    return k;
  };
  const plan::Kernel fwd = kernelOf("attention"),
                     bwd = kernelOf("attention_grad");
  const KernelAttrs fwdAttrs = decodeKernelAttrs(fwd),
                    bwdAttrs = decodeKernelAttrs(bwd);
  const KernelInfo *fwdInfo = device->findKernel("attention");
  const KernelInfo *bwdInfo = device->findKernel("attention_grad");
  if (!fwdInfo || !bwdInfo)
    return fail("the device has no attention kernels");
  TensorRef qkvRef{plan::F32, {rows, cols}, qkv};
  TensorRef yRef{plan::F32, {rows, yCols}, y};
  TensorRef lseRef{plan::F32, {rows, 2 * hq}, lse};
  TensorRef dyRef{plan::F32, {rows, yCols}, dy};
  TensorRef dqkvRef{plan::F32, {rows, cols}, dqkv};
  KernelContext kctx;
  kctx.lowPrecision = true;
  auto runFwd = [&] {
    return device->runKernel(*fwdInfo, fwd, fwdAttrs, {qkvRef}, {yRef, lseRef},
                             kctx);
  };
  auto runBwd = [&] {
    // From the forward's y and lse (timed first, so they are its).
    return device->runKernel(*bwdInfo, bwd, bwdAttrs,
                             {qkvRef, yRef, lseRef, dyRef}, {dqkvRef}, kctx);
  };
  using Clock = std::chrono::steady_clock;
  auto timed = [&](auto run, double &ms) -> Status {
    PIPER_RETURN_IF_ERROR(run()); // warm-up (and cuDNN's plans)
    Clock::time_point start = Clock::now();
    for (int i = 0; i < iters; ++i)
      PIPER_RETURN_IF_ERROR(run());
    ms = std::chrono::duration<double, std::milli>(Clock::now() - start)
             .count() /
         iters;
    return Status::ok();
  };
  double fwdMs = 0, bwdMs = 0;
  st = timed(runFwd, fwdMs);
  if (st)
    st = timed(runBwd, bwdMs);
  for (const auto &[p, bytes] : blocks)
    memory.deallocate(p, bytes);
  if (!st)
    return fail(st.message());
  fmt::print("{{\"fwd_ms\": {:.6f}, \"bwd_ms\": {:.6f}, \"mode\": \"{}\", "
             "\"backend\": \"{}\", \"shape\": [{}, {}, {}, {}, {}], "
             "\"iters\": {}}}\n",
             fwdMs, bwdMs, mode, backend, b, hq, hkv, t, d, iters);
  return 0;
}
