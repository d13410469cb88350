// The optimizer step's device work on a GPU device, against the CPU's or
// against itself (KernelCases.h): sums of squares, batched sums, fused
// AdamW calls, the clipped step's norm and factor.
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>

#include "runtime/hal/gpu/test/KernelCases.h"

namespace piper::runtime::hal::testing {

std::string compareSquareSums(Device &cpu, Device &gpu, double rtol) {
  // Lengths around the GPU's chunk (kSquaresChunk, 16384) and the CPU's
  // grain; each span goes to a slot out of order.
  const std::vector<int64_t> lengths = {0, 1, 1000, 2 * 16384 + 5, 100003};
  const std::vector<int> slots = {3, 0, 4, 1, 2};
  const int count = 6; // one slot more than measured
  std::mt19937_64 rng(17);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<std::vector<uint32_t>> words;
  for (int64_t n : lengths) {
    words.emplace_back(static_cast<size_t>(n));
    for (uint32_t &w : words.back()) {
      float f = normal(rng);
      std::memcpy(&w, &f, 4);
    }
  }
  auto sumsOn = [&](Device &device, std::vector<double> &sums) -> Status {
    DeviceRun run{device, {}, {}, {}};
    std::vector<SquaresSpan> first, second;
    for (size_t i = 0; i < lengths.size(); ++i) {
      TensorRef t = run.upload(Operand{plan::F32, {lengths[i]}}, words[i]);
      (i % 2 ? second : first)
          .push_back(
              {static_cast<const float *>(t.data), lengths[i], slots[i]});
    }
    PIPER_RETURN_IF_ERROR(run.status);
    std::unique_ptr<SquareSums> squares;
    PIPER_RETURN_IF_ERROR(device.createSquareSums(count, squares));
    PIPER_RETURN_IF_ERROR(squares->measure(first));
    PIPER_RETURN_IF_ERROR(squares->measure(second));
    sums.assign(count, -1.0);
    PIPER_RETURN_IF_ERROR(squares->read(sums.data(), count - 1));
    if (squares->measure({{first[0].data, 1, count}}) ||
        squares->read(sums.data(), count + 1))
      return Status::error("a slot out of range was accepted");
    return Status::ok();
  };
  std::vector<double> want, got;
  for (auto [device, sums] :
       {std::make_pair(&cpu, &want), std::make_pair(&gpu, &got)}) {
    Status st = sumsOn(*device, *sums);
    if (!st)
      return device->name() + ": " + st.message();
  }
  std::ostringstream bad;
  for (size_t i = 0; i < lengths.size(); ++i) {
    double w = want[size_t(slots[i])], g = got[size_t(slots[i])];
    if (!(std::fabs(g - w) <= rtol * std::fabs(w)))
      bad << "span of " << lengths[i] << " (slot " << slots[i] << "): cpu " << w
          << ", gpu " << g << "; ";
  }
  if (want[count - 1] != -1.0 || got[count - 1] != -1.0)
    bad << "read more slots than asked; ";
  return bad.str();
}

std::string compareSquaresBatching(Device &gpu, double rtol) {
  const std::vector<int64_t> kinds = {0, 1, 37, 16384, 16385, 40000};
  const int count = 110; // more than two launches' batches
  std::mt19937_64 rng(29);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<std::vector<uint32_t>> words(count);
  std::vector<double> host(count, 0.0);
  for (int i = 0; i < count; ++i) {
    words[size_t(i)].resize(size_t(kinds[rng() % kinds.size()]));
    for (uint32_t &w : words[size_t(i)]) {
      float f = normal(rng) * float(1 + i % 7);
      host[size_t(i)] += double(f) * double(f);
      std::memcpy(&w, &f, 4);
    }
  }
  DeviceRun run{gpu, {}, {}, {}};
  std::vector<SquaresSpan> spans;
  for (int i = 0; i < count; ++i) {
    int64_t n = int64_t(words[size_t(i)].size());
    TensorRef t = run.upload(Operand{plan::F32, {n}}, words[size_t(i)]);
    // Slots in reverse: a span's slot is not its position.
    spans.push_back({static_cast<const float *>(t.data), n, count - 1 - i});
  }
  if (!run.status)
    return run.status.message();
  std::vector<double> together(count), alone(count);
  Status st = [&]() -> Status {
    std::unique_ptr<SquareSums> a, b;
    PIPER_RETURN_IF_ERROR(gpu.createSquareSums(count, a));
    PIPER_RETURN_IF_ERROR(gpu.createSquareSums(count, b));
    PIPER_RETURN_IF_ERROR(a->measure(spans));
    for (const SquaresSpan &span : spans)
      PIPER_RETURN_IF_ERROR(b->measure({span}));
    PIPER_RETURN_IF_ERROR(a->read(together.data(), count));
    return b->read(alone.data(), count);
  }();
  if (!st)
    return gpu.name() + ": " + st.message();
  std::ostringstream bad;
  for (int i = 0; i < count; ++i) {
    double t = together[size_t(count - 1 - i)],
           s = alone[size_t(count - 1 - i)];
    double h = host[size_t(i)];
    if (std::memcmp(&t, &s, sizeof t) != 0)
      bad << "span " << i << " of " << words[size_t(i)].size()
          << ": measured with the others " << t << ", alone " << s << "; ";
    else if (!(std::fabs(t - h) <= rtol * std::fabs(h)))
      bad << "span " << i << " of " << words[size_t(i)].size() << ": " << t
          << ", host " << h << "; ";
  }
  return bad.str();
}

std::string compareAdamwCalls(Device &gpu) {
  const int count = 70;
  const std::vector<int64_t> sizes = {0, 1, 33, 1000, 70001};
  std::mt19937_64 rng(31);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<plan::Kernel> kernels(count);
  std::vector<KernelAttrs> attrs(count);
  std::vector<int64_t> n(count);
  // Per call: grad, param, m, v, copy (host words).
  std::vector<std::array<std::vector<uint32_t>, 5>> words(count);
  for (int i = 0; i < count; ++i) {
    plan::Kernel &k = kernels[size_t(i)];
    k.set_op("adamw");
    (*k.mutable_attrs())["lr"] = floatAttr(1e-3 * (1 + i % 2));
    (*k.mutable_attrs())["weight_decay"] = floatAttr(0.01 * (i % 3));
    attrs[size_t(i)] = decodeKernelAttrs(k);
    n[size_t(i)] = sizes[rng() % sizes.size()];
    for (int t = 0; t < 5; ++t) {
      words[size_t(i)][size_t(t)].resize(size_t(n[size_t(i)]));
      for (uint32_t &w : words[size_t(i)][size_t(t)]) {
        float f = t == 3 ? std::fabs(normal(rng)) * 1e-3f : normal(rng);
        std::memcpy(&w, &f, 4);
      }
    }
  }
  // The calls on `gpu`, uploaded afresh; run together or one by one.
  // `prescale`: the gradients multiplied by it on the host first (as
  // CLIP_GRADS once scaled them, before the update read them).
  auto runAll = [&](bool together, const float *clip,
                    std::vector<std::array<std::vector<uint32_t>, 5>> &out,
                    std::string &error, size_t &failed,
                    const plan::Kernel *broken, float prescale = 1.0f) {
    DeviceRun run{gpu, {}, {}, {}};
    std::vector<AdamwCall> calls(count);
    std::vector<std::array<TensorRef, 5>> refs(count);
    for (int i = 0; i < count; ++i) {
      for (int t = 0; t < 5; ++t) {
        std::vector<uint32_t> w = words[size_t(i)][size_t(t)];
        if (t == 0 && prescale != 1.0f)
          for (uint32_t &x : w) {
            float f;
            std::memcpy(&f, &x, 4);
            f *= prescale;
            std::memcpy(&x, &f, 4);
          }
        refs[size_t(i)][size_t(t)] =
            run.upload(Operand{plan::F32, {n[size_t(i)]}}, w);
      }
      AdamwCall &c = calls[size_t(i)];
      c.kernel = broken && i == 41 ? broken : &kernels[size_t(i)];
      c.attrs = &attrs[size_t(i)];
      c.inputs = {refs[size_t(i)][0]};
      c.outputs = {refs[size_t(i)][1], refs[size_t(i)][2], refs[size_t(i)][3]};
      c.bf16Copy = i % 4 == 1 ? refs[size_t(i)][4].f32() : nullptr;
    }
    TensorRef factor;
    if (clip) {
      std::vector<uint32_t> w(1);
      std::memcpy(&w[0], clip, 4);
      factor = run.upload(Operand{plan::F32, {1}}, w);
    }
    if (!run.status) {
      error = run.status.message();
      return;
    }
    KernelContext ctx;
    ctx.step = 3;
    ctx.lrScale = 0.5;
    ctx.clipFactor = clip ? factor.f32() : nullptr;
    const KernelInfo *info = gpu.findKernel("adamw");
    Status st;
    if (together) {
      st = gpu.runAdamwCalls(*info, calls, ctx, failed);
    } else {
      for (failed = 0; failed < calls.size() && st; ++failed) {
        ctx.bf16Copy = calls[failed].bf16Copy;
        st = gpu.runKernel(*info, *calls[failed].kernel, *calls[failed].attrs,
                           calls[failed].inputs, calls[failed].outputs, ctx);
      }
      if (!st)
        --failed;
    }
    if (!st) {
      error = st.message();
      return;
    }
    out.assign(count, {});
    for (int i = 0; i < count; ++i)
      for (int t = 0; t < 5; ++t)
        out[size_t(i)][size_t(t)] = run.download(refs[size_t(i)][size_t(t)]);
    if (!run.status)
      error = run.status.message();
  };
  std::ostringstream bad;
  const float nan = std::numeric_limits<float>::quiet_NaN(), one = 1.0f,
              clips = 0.3f;
  for (const float *clip :
       {static_cast<const float *>(nullptr), &one, &clips, &nan}) {
    std::vector<std::array<std::vector<uint32_t>, 5>> together, alone;
    std::string e1, e2;
    size_t f1 = 0, f2 = 0;
    runAll(true, clip, together, e1, f1, nullptr);
    runAll(false, clip, alone, e2, f2, nullptr);
    if (!e1.empty() || !e2.empty())
      return gpu.name() + ": " + e1 + " | " + e2;
    for (int i = 0; i < count; ++i)
      for (int t = 1; t < 5; ++t)
        if (together[size_t(i)][size_t(t)] != alone[size_t(i)][size_t(t)])
          bad << "call " << i << " (" << n[size_t(i)] << " elements), "
              << (t == 4 ? "bf16 copy" : "output " + std::to_string(t - 1))
              << (clip ? ", clip factor " + std::to_string(*clip) : "")
              << " differs; ";
    if (clip && std::isnan(*clip))
      for (int i = 0; i < count; ++i)
        if (together[size_t(i)][1] != words[size_t(i)][1])
          bad << "call " << i << " updated under a NaN clip factor; ";
    // A clip factor: each gradient times it, then the update, bit for bit
    // (the pass that scaled the gradients before the update is gone).
    if (clip && std::isfinite(*clip)) {
      std::vector<std::array<std::vector<uint32_t>, 5>> prescaled;
      std::string e3;
      size_t f3 = 0;
      runAll(false, nullptr, prescaled, e3, f3, nullptr, *clip);
      if (!e3.empty())
        return gpu.name() + ": " + e3;
      for (int i = 0; i < count; ++i)
        for (int t = 1; t < 5; ++t)
          if (together[size_t(i)][size_t(t)] != prescaled[size_t(i)][size_t(t)])
            bad << "call " << i << ", clip factor " << *clip << ": output "
                << t - 1 << " is not the update of the scaled gradient; ";
    }
  }
  // A malformed call (beta1 = 1) in the middle: runKernel's message, and
  // its index.
  plan::Kernel broken = kernels[41];
  (*broken.mutable_attrs())["beta1"] = floatAttr(1.0);
  KernelAttrs brokenAttrs = decodeKernelAttrs(broken);
  std::swap(attrs[41], brokenAttrs);
  std::vector<std::array<std::vector<uint32_t>, 5>> unused;
  std::string e1, e2;
  size_t f1 = 0, f2 = 0;
  runAll(true, nullptr, unused, e1, f1, &broken);
  runAll(false, nullptr, unused, e2, f2, &broken);
  std::swap(attrs[41], brokenAttrs);
  if (e1.empty() || e1 != e2 || f1 != 41 || f2 != 41)
    bad << "the malformed call 41: together '" << e1 << "' (call " << f1
        << "), alone '" << e2 << "' (call " << f2 << "); ";
  return bad.str();
}

std::string compareGradClip(Device &cpu, Device &gpu, double rtol) {
  const std::vector<int64_t> lengths = {1000, 2 * 16384 + 5, 7};
  const std::vector<double> weights = {0.5, 1.0, 0.25};
  const double replicas = 2;
  std::mt19937_64 rng(23);
  std::normal_distribution<float> normal(0.0f, 1.5f);
  std::vector<std::vector<float>> data;
  double hostTotal = 0; // the host's weighed sum, in slot order
  for (size_t i = 0; i < lengths.size(); ++i) {
    data.emplace_back(static_cast<size_t>(lengths[i]));
    double squares = 0;
    for (float &f : data.back()) {
      f = normal(rng);
      squares += double(f) * double(f);
    }
    hostTotal += squares * weights[i];
  }
  const double hostNorm = std::sqrt(hostTotal / replicas);
  struct Clip {
    const char *what;
    double maxNorm;
    bool nan; // a NaN in the last span
  };
  const Clip clips[] = {{"a norm that clips", hostNorm / 3, false},
                        {"a norm under the bound", hostNorm * 2, false},
                        {"no bound", 0, false},
                        {"a NaN gradient", 1.0, true}};
  std::ostringstream bad;
  double cpuNorm[4] = {0, 0, 0, 0};
  for (Device *device : {&cpu, &gpu}) {
    const std::string name = device->name();
    for (int c = 0; c < 4; ++c) {
      const Clip &clip = clips[c];
      DeviceRun run{*device, {}, {}, {}};
      std::vector<SquaresSpan> spans;
      std::vector<TensorRef> tensors;
      for (size_t i = 0; i < lengths.size(); ++i) {
        std::vector<uint32_t> words(data[i].size());
        std::memcpy(words.data(), data[i].data(), words.size() * 4);
        if (clip.nan && i + 1 == lengths.size())
          words[3] = 0x7FC00000u;
        tensors.push_back(run.upload(Operand{plan::F32, {lengths[i]}}, words));
        spans.push_back({static_cast<const float *>(tensors.back().data),
                         lengths[i], int(i)});
      }
      std::unique_ptr<SquareSums> squares;
      double norm = -1;
      float factor = 0;
      auto steps = [&]() -> Status {
        PIPER_RETURN_IF_ERROR(run.status);
        PIPER_RETURN_IF_ERROR(
            device->createSquareSums(int(lengths.size()), squares));
        if (squares->setWeights({1.0}))
          return Status::error("one weight for three slots was accepted");
        PIPER_RETURN_IF_ERROR(squares->setWeights(weights));
        PIPER_RETURN_IF_ERROR(squares->measure(spans));
        PIPER_RETURN_IF_ERROR(squares->weigh());
        PIPER_RETURN_IF_ERROR(squares->clip(replicas, clip.maxNorm));
        PIPER_RETURN_IF_ERROR(squares->readNorm(norm));
        return device->allocator().copyToHost(&factor, squares->factor(),
                                              sizeof(float));
      };
      if (Status st = steps(); !st) {
        bad << name << ", " << clip.what << ": " << st.message() << "; ";
        continue;
      }
      const std::string where = name + ", " + clip.what + ": ";
      if (clip.nan) {
        if (std::isfinite(norm) || !std::isnan(factor))
          bad << where << "norm " << norm << ", factor " << factor
              << " (want NaN for both); ";
      } else {
        if (!(std::fabs(norm - hostNorm) <= rtol * hostNorm))
          bad << where << "norm " << norm << ", host " << hostNorm << "; ";
        if (device == &cpu)
          cpuNorm[c] = norm;
        else if (!(std::fabs(norm - cpuNorm[c]) <= rtol * cpuNorm[c]))
          bad << where << "norm " << norm << ", cpu " << cpuNorm[c] << "; ";
        float want = clipFactorOf(norm, clip.maxNorm);
        if (factor != want)
          bad << where << "factor " << factor << ", want " << want << "; ";
        if ((clip.maxNorm > 0 && clip.maxNorm < norm) != (factor < 1.0f))
          bad << where << "factor " << factor << " for norm " << norm
              << " and bound " << clip.maxNorm << "; ";
      }
      if (!run.status)
        bad << where << run.status.message() << "; ";
    }
  }
  return bad.str();
}

} // namespace piper::runtime::hal::testing
