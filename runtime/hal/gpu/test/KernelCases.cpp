// The GPU kernel test harness (KernelCases.h).
#include "runtime/hal/gpu/test/KernelCases.h"

#include <array>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <sstream>

#include "support/Precision.h"

namespace piper::runtime::hal::testing {

Operand f32(std::vector<int64_t> shape, double scale) {
  Operand o;
  o.shape = std::move(shape);
  o.scale = scale;
  return o;
}
Operand positive(std::vector<int64_t> shape, double scale) {
  Operand o = f32(std::move(shape), scale);
  o.fill = Fill::Positive;
  return o;
}
Operand tokens(std::vector<int64_t> shape, int64_t limit) {
  Operand o;
  o.dtype = plan::I32;
  o.shape = std::move(shape);
  o.fill = Fill::Tokens;
  o.limit = limit;
  return o;
}
Operand given(plan::DType dtype, std::vector<int64_t> shape,
              std::vector<double> values) {
  Operand o;
  o.dtype = dtype;
  o.shape = std::move(shape);
  o.fill = Fill::Given;
  o.values = std::move(values);
  return o;
}
Operand zeros(std::vector<int64_t> shape, plan::DType dtype) {
  Operand o;
  o.dtype = dtype;
  o.shape = std::move(shape);
  o.fill = Fill::Zero;
  return o;
}

Operand lsePairs(int64_t rows, int64_t heads) {
  Operand o = zeros({rows, 2 * heads});
  o.lsePairs = true;
  return o;
}

plan::AttrValue intAttr(int64_t v) {
  plan::AttrValue a;
  a.set_i(v);
  return a;
}
plan::AttrValue floatAttr(double v) {
  plan::AttrValue a;
  a.set_f(v);
  return a;
}

std::vector<KernelCase> &kernelCases() {
  static std::vector<KernelCase> cases;
  return cases;
}

RegisterCases::RegisterCases(std::vector<KernelCase> cases) {
  for (KernelCase &c : cases)
    kernelCases().push_back(std::move(c));
}

namespace {

int64_t numel(const Operand &o) {
  int64_t n = 1;
  for (int64_t d : o.shape)
    n *= d;
  return n;
}

// Host bytes of an operand: f32 and i32 are 4 bytes per element.
std::vector<uint32_t> fill(const Operand &o, std::mt19937_64 &rng) {
  int64_t n = numel(o);
  std::vector<uint32_t> words(static_cast<size_t>(n));
  std::normal_distribution<double> normal(0.0, 1.0);
  std::uniform_real_distribution<double> uniform(0.1, 1.1);
  for (int64_t i = 0; i < n; ++i) {
    float f = 0;
    int32_t k = 0;
    switch (o.fill) {
    case Fill::Normal:
      f = static_cast<float>(normal(rng) * o.scale);
      break;
    case Fill::Positive:
      f = static_cast<float>(uniform(rng) * o.scale);
      break;
    case Fill::Tokens:
      k = static_cast<int32_t>(
          std::uniform_int_distribution<int64_t>(0, o.limit - 1)(rng));
      break;
    case Fill::Zero:
      break;
    case Fill::Given: {
      double v = o.values[static_cast<size_t>(i) % o.values.size()];
      f = static_cast<float>(v);
      k = static_cast<int32_t>(v);
      break;
    }
    }
    if (o.dtype == plan::I32)
      std::memcpy(&words[i], &k, 4);
    else
      std::memcpy(&words[i], &f, 4);
  }
  return words;
}

// The operands of one device: allocated, uploaded, downloaded. The first
// device error is kept in `status` (the case fails with it).
struct DeviceRun {
  Device &device;
  std::vector<void *> buffers;
  std::vector<size_t> sizes;
  Status status;
  ~DeviceRun() {
    for (size_t i = 0; i < buffers.size(); ++i)
      device.allocator().deallocate(buffers[i], sizes[i]);
  }
  TensorRef upload(const Operand &o, const std::vector<uint32_t> &words) {
    size_t bytes = words.size() * 4;
    void *p = nullptr;
    keep(device.allocator().allocate(bytes == 0 ? 4 : bytes, p));
    if (p) {
      buffers.push_back(p);
      sizes.push_back(bytes == 0 ? 4 : bytes);
    }
    if (bytes && p)
      keep(device.allocator().copyFromHost(p, words.data(), bytes));
    return TensorRef{o.dtype, o.shape, p};
  }
  std::vector<uint32_t> download(const TensorRef &t) {
    std::vector<uint32_t> words(static_cast<size_t>(t.numel()));
    if (!words.empty())
      keep(device.allocator().copyToHost(words.data(), t.data,
                                         words.size() * 4));
    return words;
  }
  void keep(const Status &st) {
    if (status && !st)
      status = st;
  }
};

/// One device's run of a case: its outputs and loss, or its error (with
/// the device's name) and the kernel's own message.
struct Side {
  std::vector<std::vector<uint32_t>> outs;
  double loss = 0;
  std::string error;
  std::string kernelError; // the kernel's own message, without the device
};

/// The words of the case's inputs, from `rng` (seeded by the case's name:
/// both devices, and every run of the case, get the same operands).
std::vector<std::vector<uint32_t>> inputWords(const KernelCase &c,
                                              std::mt19937_64 &rng) {
  std::vector<std::vector<uint32_t>> words;
  for (const Operand &o : c.inputs)
    words.push_back(fill(o, rng));
  return words;
}

Side runOn(const KernelCase &c, Device &device,
           const std::vector<std::vector<uint32_t>> &inWords,
           const std::vector<std::vector<uint32_t>> &outWords) {
  plan::Kernel kernel;
  kernel.set_op(c.op);
  for (const auto &[name, value] : c.attrs)
    (*kernel.mutable_attrs())[name] = value;
  Side side;
  DeviceRun run{device, {}, {}, {}};
  std::vector<TensorRef> ins, outs;
  for (size_t i = 0; i < c.inputs.size(); ++i)
    ins.push_back(run.upload(c.inputs[i], inWords[i]));
  for (size_t i = 0; i < c.outputs.size(); ++i)
    outs.push_back(run.upload(c.outputs[i], outWords[i]));
  if (!run.status) {
    side.error = device.name() + ": " + run.status.message();
    return side;
  }
  const KernelInfo *info = device.findKernel(c.op);
  if (!info) {
    side.error = device.name() + " has no kernel '" + c.op + "'";
    return side;
  }
  KernelContext ctx;
  ctx.lossAccumulator = &side.loss;
  ctx.step = c.step;
  ctx.lrScale = c.lrScale;
  ctx.lowPrecision = c.lowPrecision;
  ctx.tensorMember = c.tensorMember;
  ctx.contextMember = c.contextMember;
  TensorRef copy;
  if (c.bf16Copy && !c.outputs.empty()) {
    // Filled with NaN: an element the kernel does not write fails.
    std::vector<uint32_t> nan(outWords[0].size(), 0x7fc00001u);
    copy = run.upload(c.outputs[0], nan);
    ctx.bf16Copy = copy.f32();
  }
  Status st = device.runKernel(*info, kernel, decodeKernelAttrs(kernel), ins,
                               outs, ctx);
  if (!st) {
    side.error = device.name() + ": " + st.message();
    side.kernelError = st.message();
    return side;
  }
  for (const TensorRef &t : outs)
    side.outs.push_back(run.download(t));
  if (copy.data) {
    std::vector<uint32_t> words = run.download(copy);
    for (size_t i = 0; i < words.size() && side.error.empty(); ++i) {
      float param, got;
      std::memcpy(&param, &side.outs[0][i], 4);
      std::memcpy(&got, &words[i], 4);
      float want = roundToBf16(param);
      if (std::memcmp(&want, &got, 4) != 0)
        side.error = device.name() + ": bf16 copy[" + std::to_string(i) +
                     "] is " + std::to_string(got) + ", not " +
                     std::to_string(want) + " (output 0 rounded)";
    }
  }
  if (!run.status)
    side.error = device.name() + ": " + run.status.message();
  return side;
}

} // namespace

std::string runOutputsFrom(const KernelCase &c, Device &device,
                           uint32_t outputWord,
                           std::vector<std::vector<uint32_t>> &outputs) {
  std::mt19937_64 rng(std::hash<std::string>()(c.name));
  std::vector<std::vector<uint32_t>> outWords;
  for (const Operand &o : c.outputs) {
    int64_t n = 1;
    for (int64_t d : o.shape)
      n *= d;
    outWords.emplace_back(static_cast<size_t>(n), outputWord);
  }
  Side side = runOn(c, device, inputWords(c, rng), outWords);
  outputs = std::move(side.outs);
  return side.error;
}

CaseResult runCase(const KernelCase &c, Device &cpu, Device &gpu) {
  CaseResult result;
  std::mt19937_64 rng(std::hash<std::string>()(c.name));
  std::vector<std::vector<uint32_t>> inWords = inputWords(c, rng), outWords;
  for (const Operand &o : c.outputs)
    outWords.push_back(fill(o, rng));
  Side want = runOn(c, cpu, inWords, outWords),
       got = runOn(c, gpu, inWords, outWords);
  if (!c.rejects.empty()) {
    if (want.kernelError.empty() || got.kernelError.empty())
      result.error = std::string("expected both devices to reject the call (") +
                     c.rejects + "); " +
                     (want.kernelError.empty() ? "cpu accepted it"
                                               : "the gpu accepted it");
    else if (want.kernelError != got.kernelError)
      result.error = "different messages: " + want.error + " | " + got.error;
    else if (want.kernelError.find(c.rejects) == std::string::npos)
      result.error =
          "message '" + want.kernelError + "' lacks '" + c.rejects + "'";
    return result;
  }
  if (!want.error.empty() || !got.error.empty()) {
    result.error = want.error.empty()  ? got.error
                   : got.error.empty() ? want.error
                                       : want.error + "; " + got.error;
    return result;
  }
  std::ostringstream bad;
  auto compare = [&](double w, double g, const std::string &where) {
    double bound = c.atol + c.rtol * std::fabs(w);
    double diff = std::fabs(g - w);
    if (std::isnan(w) != std::isnan(g) || diff > bound) {
      if (bad.tellp() == 0)
        bad << where << ": cpu " << w << ", gpu " << g;
      result.worstRelative = INFINITY;
      return;
    }
    if (bound > 0 && diff / bound > result.worstRelative)
      result.worstRelative = diff / bound;
  };
  auto f32At = [](const std::vector<uint32_t> &words, size_t i) {
    float f;
    std::memcpy(&f, &words[i], 4);
    return double(f);
  };
  for (size_t o = 0; o < c.outputs.size(); ++o) {
    if (c.outputs[o].lsePairs) {
      const size_t heads = size_t(c.outputs[o].shape[1] / 2);
      for (size_t i = 0; i < want.outs[o].size(); ++i) {
        size_t row = i / (2 * heads), h = i % (2 * heads);
        if (h >= heads)
          continue; // the rest, added to its head's value
        compare(f32At(want.outs[o], i) + f32At(want.outs[o], i + heads),
                f32At(got.outs[o], i) + f32At(got.outs[o], i + heads),
                "output " + std::to_string(o) + " lse[" + std::to_string(row) +
                    ", head " + std::to_string(h) + "]");
      }
      continue;
    }
    for (size_t i = 0; i < want.outs[o].size(); ++i) {
      double w = 0, g = 0;
      if (c.outputs[o].dtype == plan::I32) {
        int32_t a, b;
        std::memcpy(&a, &want.outs[o][i], 4);
        std::memcpy(&b, &got.outs[o][i], 4);
        w = a;
        g = b;
      } else {
        float a, b;
        std::memcpy(&a, &want.outs[o][i], 4);
        std::memcpy(&b, &got.outs[o][i], 4);
        w = a;
        g = b;
      }
      compare(w, g,
              "output " + std::to_string(o) + "[" + std::to_string(i) + "]");
    }
  }
  if (c.checksLoss)
    compare(want.loss, got.loss, "loss accumulator");
  result.error = bad.str();
  return result;
}

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
  auto runAll = [&](bool together, const float *clip,
                    std::vector<std::array<std::vector<uint32_t>, 5>> &out,
                    std::string &error, size_t &failed,
                    const plan::Kernel *broken) {
    DeviceRun run{gpu, {}, {}, {}};
    std::vector<AdamwCall> calls(count);
    std::vector<std::array<TensorRef, 5>> refs(count);
    for (int i = 0; i < count; ++i) {
      for (int t = 0; t < 5; ++t)
        refs[size_t(i)][size_t(t)] = run.upload(
            Operand{plan::F32, {n[size_t(i)]}}, words[size_t(i)][size_t(t)]);
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
  const float nan = std::numeric_limits<float>::quiet_NaN(), one = 1.0f;
  for (const float *clip : {static_cast<const float *>(nullptr), &one, &nan}) {
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
              << (clip ? (*clip == 1 ? ", clip factor 1" : ", NaN factor") : "")
              << " differs; ";
    if (clip && std::isnan(*clip))
      for (int i = 0; i < count; ++i)
        if (together[size_t(i)][1] != words[size_t(i)][1])
          bad << "call " << i << " updated under a NaN clip factor; ";
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
        for (size_t i = 0; i < lengths.size(); ++i)
          PIPER_RETURN_IF_ERROR(
              device->scaleBy(tensors[i].f32(), squares->factor(), lengths[i]));
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
      // Scaled by that factor exactly, or untouched (1 or NaN).
      for (size_t i = 0; i < lengths.size(); ++i) {
        std::vector<uint32_t> got = run.download(tensors[i]);
        for (size_t j = 0; j < got.size(); ++j) {
          float x = data[i][j];
          if (clip.nan && i + 1 == lengths.size() && j == 3)
            continue;
          float want = std::isfinite(factor) && factor != 1.0f ? x * factor : x;
          float g;
          std::memcpy(&g, &got[j], 4);
          if (g != want) {
            bad << where << "span " << i << " element " << j << ": " << g
                << ", want " << want << "; ";
            break;
          }
        }
      }
      if (!run.status)
        bad << where << run.status.message() << "; ";
    }
  }
  return bad.str();
}

} // namespace piper::runtime::hal::testing
