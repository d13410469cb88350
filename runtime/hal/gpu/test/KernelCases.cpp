// The GPU kernel test harness (KernelCases.h).
#include "runtime/hal/gpu/test/KernelCases.h"

#include <cmath>
#include <cstring>
#include <functional>
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

/// Where the loss accumulator starts (exact in binary).
constexpr double kLossStart = 0.375;

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
  plan::Kernel kernel = kernelOf(c);
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
  // The loss accumulator is device memory (hal::LossSums), starting at a
  // value of its own, so that a kernel that sets it instead of adding to it
  // fails.
  void *lossSlot = nullptr;
  run.keep(device.allocator().allocate(sizeof(double), lossSlot));
  if (lossSlot) {
    run.buffers.push_back(lossSlot);
    run.sizes.push_back(sizeof(double));
    const double start = kLossStart;
    run.keep(device.allocator().copyFromHost(lossSlot, &start, sizeof start));
  }
  if (!run.status) {
    side.error = device.name() + ": " + run.status.message();
    return side;
  }
  KernelContext ctx;
  ctx.lossAccumulator = static_cast<double *>(lossSlot);
  ctx.step = c.step;
  ctx.lrScale = c.lrScale;
  ctx.lowPrecision = c.lowPrecision;
  ctx.tensorMember = c.tensorMember;
  ctx.contextMember = c.contextMember;
  TensorRef copy;
  if ((c.bf16Copy || c.packedCopy) && !c.outputs.empty()) {
    // Filled with NaN: an element the kernel does not write fails (a
    // packed copy uses the first half of the block).
    std::vector<uint32_t> nan(outWords[0].size(),
                              c.packedCopy ? 0x7fc17fc1u : 0x7fc00001u);
    copy = run.upload(c.outputs[0], nan);
    if (c.packedCopy)
      ctx.bf16PackedCopy = static_cast<uint16_t *>(copy.data);
    else
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
  run.keep(device.allocator().copyToHost(&side.loss, lossSlot, sizeof(double)));
  if (copy.data) {
    std::vector<uint32_t> words = run.download(copy);
    std::vector<uint16_t> halves(2 * words.size());
    std::memcpy(halves.data(), words.data(), 4 * words.size());
    for (size_t i = 0; i < words.size() && side.error.empty(); ++i) {
      float param, got;
      std::memcpy(&param, &side.outs[0][i], 4);
      if (c.packedCopy)
        got = bf16ToFloat(halves[i]);
      else
        std::memcpy(&got, &words[i], 4);
      float want = roundToBf16(param);
      if (std::memcmp(&want, &got, 4) != 0)
        side.error = device.name() + ": bf16 copy[" + std::to_string(i) +
                     "] is " + std::to_string(got) + ", not " +
                     std::to_string(want) + " (output 0 rounded" +
                     (c.packedCopy ? ", packed)" : ")");
    }
  }
  if (!run.status)
    side.error = device.name() + ": " + run.status.message();
  return side;
}

} // namespace

namespace {
// Words of packed bf16 values: the fp32 words rounded, two to a word.
std::vector<uint32_t> packWords(const std::vector<uint32_t> &words) {
  std::vector<uint16_t> halves(words.size() + 1, 0);
  for (size_t e = 0; e < words.size(); ++e) {
    float f;
    std::memcpy(&f, &words[e], 4);
    halves[e] = floatToBf16(f);
  }
  std::vector<uint32_t> packed(halves.size() / 2);
  std::memcpy(packed.data(), halves.data(), packed.size() * 4);
  return packed;
}
} // namespace

std::set<std::string> declaredPackedOperands(Device &declaring) {
  std::set<std::string> names;
  for (const KernelCase &c : kernelCases()) {
    const KernelInfo *info = declaring.findKernel(c.op);
    if (!info || !c.rejects.empty())
      continue;
    for (size_t i = 0; i < c.inputs.size(); ++i)
      if (c.inputs[i].dtype == plan::F32 && !c.inputs[i].shape.empty() &&
          declaring.readsPackedInput(*info, static_cast<int>(i)))
        names.insert(c.op + ":" + std::to_string(i));
    for (size_t o = 0; o < c.outputs.size(); ++o)
      if (c.outputs[o].dtype == plan::F32 && !c.outputs[o].shape.empty() &&
          declaring.writesPackedOutput(*info, static_cast<int>(o)))
        names.insert(c.op + ":out" + std::to_string(o));
  }
  return names;
}

std::string comparePackedOperands(Device &declaring, Device &device,
                                  int64_t maxElements,
                                  std::set<std::string> &checked) {
  for (const KernelCase &c : kernelCases()) {
    const KernelInfo *info = declaring.findKernel(c.op);
    if (!info || !c.rejects.empty())
      continue;
    std::vector<size_t> packable, packedOuts;
    int64_t elements = 0;
    for (size_t i = 0; i < c.inputs.size(); ++i) {
      elements += numel(c.inputs[i]);
      if (c.inputs[i].dtype == plan::F32 && !c.inputs[i].shape.empty() &&
          declaring.readsPackedInput(*info, static_cast<int>(i)))
        packable.push_back(i);
    }
    for (size_t o = 0; o < c.outputs.size(); ++o) {
      elements += numel(c.outputs[o]);
      if (c.outputs[o].dtype == plan::F32 && !c.outputs[o].shape.empty() &&
          declaring.writesPackedOutput(*info, static_cast<int>(o)))
        packedOuts.push_back(o);
    }
    if ((packable.empty() && packedOuts.empty()) || elements > maxElements)
      continue;
    KernelCase low = c;
    low.lowPrecision = true;
    std::mt19937_64 rng(std::hash<std::string>()(c.name));
    std::vector<std::vector<uint32_t>> ins = inputWords(c, rng), outs;
    for (const Operand &o : c.outputs)
      outs.push_back(fill(o, rng));
    // The packable inputs hold bf16 values, as a packed step buffer's do.
    std::vector<std::vector<uint32_t>> packedWords(ins.size());
    for (size_t i : packable) {
      packedWords[i] = packWords(ins[i]);
      for (uint32_t &w : ins[i]) {
        float f;
        std::memcpy(&f, &w, 4);
        f = roundToBf16(f);
        std::memcpy(&w, &f, 4);
      }
    }
    Side want = runOn(low, device, ins, outs);
    if (!want.error.empty())
      return "case " + c.name + ": " + want.error;
    // Each packed output: the fp32 run's packed (the elements it does not
    // write, a padding, keep their initial values' packing).
    for (size_t o : packedOuts) {
      KernelCase withPacked = low;
      withPacked.outputs[o].dtype = plan::BF16;
      std::vector<std::vector<uint32_t>> initial = outs;
      initial[o] = packWords(outs[o]);
      const std::string what =
          "case " + c.name + ", packed output " + std::to_string(o);
      checked.insert(c.op + ":out" + std::to_string(o));
      Side got = runOn(withPacked, device, ins, initial);
      if (!got.error.empty())
        return what + ": " + got.error;
      std::vector<std::vector<uint32_t>> expected = want.outs;
      expected[o] = packWords(want.outs[o]);
      if (got.outs != expected || got.loss != want.loss)
        return what + ": " + device.name() +
               "'s outputs are not the fp32 outputs packed";
      withPacked.lowPrecision = false;
      Side refused = runOn(withPacked, device, ins, initial);
      if (refused.kernelError.find("must be f32, got bf16") ==
          std::string::npos)
        return what + " without mixed precision: expected a refusal, got '" +
               refused.error + "'";
    }
    // Each packable input alone, then all of them.
    std::vector<std::vector<size_t>> sets;
    for (size_t i : packable)
      sets.push_back({i});
    if (packable.size() > 1)
      sets.push_back(packable);
    for (const std::vector<size_t> &set : sets) {
      KernelCase withPacked = low;
      std::vector<std::vector<uint32_t>> words = ins;
      std::string which;
      for (size_t i : set) {
        withPacked.inputs[i].dtype = plan::BF16;
        words[i] = packedWords[i];
        which += (which.empty() ? "" : ",") + std::to_string(i);
        checked.insert(c.op + ":" + std::to_string(i));
      }
      Side got = runOn(withPacked, device, words, outs);
      if (!got.error.empty())
        return "case " + c.name + ", packed input " + which + ": " + got.error;
      if (got.outs != want.outs || got.loss != want.loss)
        return "case " + c.name + ", packed input " + which + ": " +
               device.name() + "'s outputs differ from the fp32 inputs'";
      // Outside mixed precision a packed input is refused.
      withPacked.lowPrecision = false;
      Side refused = runOn(withPacked, device, words, outs);
      if (refused.kernelError.find("must be f32, got bf16") ==
          std::string::npos)
        return "case " + c.name + ", packed input " + which +
               " without mixed precision: expected a refusal, got '" +
               refused.error + "'";
    }
  }
  return "";
}

plan::Kernel kernelOf(const KernelCase &c) {
  plan::Kernel kernel;
  kernel.set_op(c.op);
  for (const auto &[name, value] : c.attrs)
    (*kernel.mutable_attrs())[name] = value;
  return kernel;
}

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

} // namespace piper::runtime::hal::testing
