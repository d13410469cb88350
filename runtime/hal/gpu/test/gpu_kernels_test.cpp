// The GPU kernels' host emulation against the CPU kernels: every registered
// case (test/*Cases.cpp), and every GPU kernel has a case. Built with
// PIPER_GPU_LANES32 (gpu_kernels_lanes_test), the kernels run 32 lanes per
// row on host threads: there, the cases up to kLanesElements operand
// elements, and every kernel must have one. Also the gradient norm's sums
// of squares.
#include <catch2/catch.hpp>

#include <cstring>
#include <set>

#ifdef PIPER_GPU_LANES32
#include <sys/wait.h>
#include <unistd.h>

#include "runtime/hal/gpu/HostExec.h"
#endif

#include "proto/KernelIds.h"
#include "runtime/hal/cpu/CpuDevice.h"
#include "runtime/hal/gpu/GpuKernels.h"
#include "runtime/hal/gpu/host/EmulatedDevice.h"
#include "runtime/hal/gpu/test/KernelCases.h"
#include "support/Precision.h"

using namespace piper;
using namespace piper::runtime;
using namespace piper::runtime::hal;

namespace {

int64_t operandElements(const testing::KernelCase &c) {
  int64_t total = 0;
  for (const auto *list : {&c.inputs, &c.outputs})
    for (const testing::Operand &o : *list) {
      int64_t n = 1;
      for (int64_t d : o.shape)
        n *= d;
      total += n;
    }
  return total;
}

#ifdef PIPER_GPU_LANES32
constexpr int64_t kLanesElements = 3600;
#else
constexpr int64_t kLanesElements = INT64_MAX;
#endif

} // namespace

TEST_CASE("the emulated GPU kernels agree with the CPU kernels") {
  auto cpu = createCpuDevice(nullptr);
  auto gpu = createEmulatedGpuDevice(nullptr);
  REQUIRE(!testing::kernelCases().empty());
  std::set<std::string> ran;
  for (const testing::KernelCase &c : testing::kernelCases()) {
    if (operandElements(c) > kLanesElements)
      continue;
    INFO("case " << c.name << " (" << c.op << ")");
    testing::CaseResult r = testing::runCase(c, *cpu, *gpu);
    CHECK(r.error == "");
    ran.insert(c.op);
  }
  for (const auto &k : hal::PIPER_GPU_NS::kernels()) {
    INFO("kernel " << k.name << " ran no case");
    CHECK(ran.count(k.name) == 1);
  }
}

// gpu-review C.12: the gradient norm's sums of squares, measured into
// device slots and read at once.
TEST_CASE("the emulated GPU's sums of squares agree with the CPU's") {
  auto cpu = createCpuDevice(nullptr);
  auto gpu = createEmulatedGpuDevice(nullptr);
  CHECK(testing::compareSquareSums(*cpu, *gpu) == "");
  // Measured together in batches, each sum has the bits it has alone.
  CHECK(testing::compareSquaresBatching(*gpu) == "");
}

TEST_CASE("the emulated GPU's fused AdamW calls give each call's own bits, "
          "and the clip factor scales each gradient as a pass before did") {
  auto gpu = createEmulatedGpuDevice(nullptr);
  CHECK(testing::compareAdamwCalls(*gpu) == "");
  // The CPU backend runs the calls one by one; its clip factor too.
  auto cpu = createCpuDevice(nullptr);
  CHECK(testing::compareAdamwCalls(*cpu) == "");
}

TEST_CASE("the emulated GPU's clipped-step norm and clip factor agree with "
          "the CPU's") {
  auto cpu = createCpuDevice(nullptr);
  auto gpu = createEmulatedGpuDevice(nullptr);
  CHECK(testing::compareGradClip(*cpu, *gpu) == "");
}

TEST_CASE("every GPU kernel has a test case") {
  std::set<std::string> tested;
  for (const testing::KernelCase &c : testing::kernelCases())
    tested.insert(c.op);
  for (const auto &k : hal::PIPER_GPU_NS::kernels()) {
    INFO("kernel " << k.name);
    CHECK(tested.count(k.name) == 1);
  }
}

// The executor skips zeroing a value whose first kernel writes it whole
// (Kernels.h kernelReadsOutputs): every kernel not declared to read its
// outputs must give the same bits from outputs that start as zeros and as a
// NaN canary, on the CPU and on the emulated GPU, in every case; the
// declared ones must read them somewhere (the declaration is not stale).
TEST_CASE("kernels write every element of their outputs, but those declared "
          "to update them in place") {
  auto cpu = createCpuDevice(nullptr);
  auto gpu = createEmulatedGpuDevice(nullptr);
  std::set<std::string> readers;
  for (const testing::KernelCase &c : testing::kernelCases()) {
    if (!c.rejects.empty() || operandElements(c) > kLanesElements)
      continue;
    for (Device *d : {cpu.get(), gpu.get()}) {
      INFO("case " << c.name << " (" << c.op << ") on " << d->name());
      std::vector<std::vector<uint32_t>> zero, canary;
      REQUIRE(testing::runOutputsFrom(c, *d, 0u, zero) == "");
      REQUIRE(testing::runOutputsFrom(c, *d, 0x7fc00001u, canary) == "");
      if (kernelReadsOutputs(testing::kernelOf(c))) {
        if (zero != canary)
          readers.insert(c.op);
        continue;
      }
      // The vocabulary padding (valid_cols): the columns of a padded
      // output (linear's y, the dlogits) beyond the valid ones are not the
      // kernel's to write, and it must leave them as they were.
      const piper::plan::PaddedOperands *padded =
          piper::plan::findPaddedOperands(c.op);
      for (const auto &[name, value] : c.attrs) {
        if (name != "valid_cols" || !padded)
          continue;
        const int64_t valid = value.i();
        for (int o : padded->outputs) {
          const std::vector<int64_t> &shape = c.outputs[o].shape;
          REQUIRE(shape.size() == 2);
          for (int64_t r = 0; r < shape[0]; ++r)
            for (int64_t j = valid; j < shape[1]; ++j) {
              uint32_t &z = zero[o][r * shape[1] + j];
              uint32_t &n = canary[o][r * shape[1] + j];
              CHECK(z == 0u);
              CHECK(n == 0x7fc00001u);
              z = n = 0;
            }
        }
      }
      CHECK(zero == canary);
    }
  }
  for (const char *op : {"accumulate", "adamw"}) {
    INFO("kernel " << op);
    CHECK(kernelReadsOutputs(op));
    CHECK(readers.count(op) == 1);
  }
}

// Kernels that round their outputs themselves in mixed precision
// (Device::roundsOutputs; the executor then skips its rounding pass) must
// give exactly the bits of the executor's rounding: each case of such a
// kernel, run with lowPrecision, equals the same case run without it and
// its outputs but scalars rounded to bf16 after (as launchRoundBf16
// does), word for word. And they are the kernels the registry says.
// Fused kernels that also round between their steps, as the executor
// rounded the first kernel's output: their mixed-precision bits are the
// unfused kernels' (layer_kernels_test's residual norms case,
// linear_kernels_test's GELU case), not a rounding of their fp32 bits.
const std::set<std::string> kRoundsBetween = {
    "add_layer_norm",          "add_rms_norm", "layer_norm_grad_input_add",
    "rms_norm_grad_input_add", "linear_gelu",  "linear_grad_input_gelu"};

TEST_CASE("kernels that round their own outputs in mixed precision give the "
          "executor's rounding, bit for bit") {
  auto gpu = createEmulatedGpuDevice(nullptr);
  std::set<std::string> checked;
  for (const testing::KernelCase &c : testing::kernelCases()) {
    const KernelInfo *info = gpu->findKernel(c.op);
    REQUIRE(info);
    if (!c.rejects.empty() || !gpu->roundsOutputs(*info) ||
        operandElements(c) > kLanesElements)
      continue;
    checked.insert(c.op);
    // Kernels that add to their outputs (`accumulate`) round what they add,
    // not the sum (the executor rounds the unfused kernel's output, which
    // the accumulate kernel then adds: fusions_test).
    if (kRoundsBetween.count(c.op) || kernelReadsOutputs(testing::kernelOf(c)))
      continue;
    INFO("case " << c.name << " (" << c.op << ")");
    testing::KernelCase low = c, full = c;
    low.lowPrecision = true;
    full.lowPrecision = false;
    std::vector<std::vector<uint32_t>> rounded, exact;
    REQUIRE(testing::runOutputsFrom(low, *gpu, 0u, rounded) == "");
    REQUIRE(testing::runOutputsFrom(full, *gpu, 0u, exact) == "");
    REQUIRE(rounded.size() == exact.size());
    for (size_t o = 0; o < exact.size(); ++o) {
      REQUIRE(c.outputs[o].dtype == piper::plan::F32);
      if (c.outputs[o].shape.empty())
        continue; // a scalar (a loss) stays fp32
      for (uint32_t &w : exact[o]) {
        float f;
        std::memcpy(&f, &w, sizeof f);
        f = piper::roundToBf16(f);
        std::memcpy(&w, &f, sizeof f);
      }
    }
    CHECK(rounded == exact);
  }
  CHECK(checked == std::set<std::string>{"linear_grad_input",
                                         "linear",
                                         "attention",
                                         "attention_grad",
                                         "add",
                                         "bias_add",
                                         "gelu",
                                         "gelu_grad",
                                         "swiglu",
                                         "swiglu_grad",
                                         "position_add",
                                         "layer_norm",
                                         "layer_norm_grad_input",
                                         "rms_norm",
                                         "rms_norm_grad_input",
                                         "cross_entropy_grad",
                                         "cross_entropy_fused",
                                         "layer_norm_grad_weight",
                                         "rms_norm_grad_weight",
                                         "add_layer_norm",
                                         "add_rms_norm",
                                         "layer_norm_grad_input_add",
                                         "rms_norm_grad_input_add",
                                         "linear_gelu",
                                         "linear_grad_input_gelu",
                                         "embedding",
                                         "embedding_grad",
                                         "position_add_grad",
                                         "moe_dispatch",
                                         "moe_dispatch_grad",
                                         "moe_combine",
                                         "moe_combine_grad",
                                         "expert_linear",
                                         "expert_linear_grad_input"});
}

// Kernels that take packed bf16 inputs (Device::readsPackedInput: the
// GEMMs' operands that a mixed-precision step buffer feeds, passed as
// stored instead of unpacked) give the bits of the same values as fp32,
// and those that store an output packed (writesPackedOutput: the fused
// classifier's dlogits, the norms' y, the MLP activations) store the fp32
// output packed, on the emulated GPU and on the CPU (whose kernels unpack and
// pack them); and they are the operands the registry says.
TEST_CASE("packed bf16 operands give the bits of their fp32 values") {
  auto cpu = createCpuDevice(nullptr);
  auto gpu = createEmulatedGpuDevice(nullptr);
  // Attention's packed y also on the fused path (the host model of cuDNN's
  // attention: the forward writes it, the backward reads it, as stored).
  DeviceOptions fusedOptions;
  fusedOptions.attention = AttentionChoice::Cudnn;
  auto fused = createEmulatedGpuDevice(nullptr, fusedOptions);
  std::set<std::string> onGpu, onCpu, onFused;
  CHECK(testing::comparePackedOperands(*gpu, *gpu, kLanesElements, onGpu) ==
        "");
  CHECK(testing::comparePackedOperands(*gpu, *cpu, kLanesElements, onCpu) ==
        "");
  CHECK(testing::comparePackedOperands(*gpu, *fused, kLanesElements, onFused) ==
        "");
  const std::set<std::string> declared = {"linear:0",
                                          "linear:out0",
                                          "linear:1",
                                          "linear_gelu:0",
                                          "linear_gelu:1",
                                          "linear_gelu:out1",
                                          "linear_grad_input:0",
                                          "linear_grad_input:1",
                                          "linear_grad_input_gelu:0",
                                          "linear_grad_input_gelu:1",
                                          "linear_grad_input_gelu:out0",
                                          "linear_grad_weight:0",
                                          "linear_grad_weight:1",
                                          "linear_grad_weight_bias:0",
                                          "linear_grad_weight_bias:1",
                                          "cross_entropy:0",
                                          "cross_entropy_grad:0",
                                          "cross_entropy_fused:0",
                                          "cross_entropy_grad:out0",
                                          "cross_entropy_fused:out1",
                                          "layer_norm:out0",
                                          "rms_norm:out0",
                                          "add_layer_norm:out1",
                                          "add_rms_norm:out1",
                                          "embedding:out0",
                                          "embedding_grad:1",
                                          "position_add:0",
                                          "position_add:out0",
                                          "position_add_grad:0",
                                          "add_layer_norm:0",
                                          "add_layer_norm:1",
                                          "add_layer_norm:out0",
                                          "add_rms_norm:0",
                                          "add_rms_norm:1",
                                          "add_rms_norm:out0",
                                          "layer_norm:0",
                                          "rms_norm:0",
                                          "layer_norm_grad_input:0",
                                          "layer_norm_grad_input:2",
                                          "layer_norm_grad_input_add:0",
                                          "layer_norm_grad_input_add:3",
                                          "layer_norm_grad_input_add:out0",
                                          "layer_norm_grad_input:out0",
                                          "rms_norm_grad_input_add:3",
                                          "rms_norm_grad_input_add:out0",
                                          "rms_norm_grad_input:out0",
                                          "layer_norm_grad_weight:0",
                                          "rms_norm_grad_input:0",
                                          "rms_norm_grad_input_add:0",
                                          "rms_norm_grad_weight:0",
                                          "layer_norm_grad_input_add:2",
                                          "layer_norm_grad_weight:1",
                                          "rms_norm_grad_input:2",
                                          "rms_norm_grad_input_add:2",
                                          "rms_norm_grad_weight:1",
                                          "gelu:out0",
                                          "attention:0",
                                          "attention:out0",
                                          "attention_grad:0",
                                          "attention_grad:1",
                                          "attention_grad:3",
                                          "attention_grad:out0",
                                          "linear_grad_input:out0",
                                          "gelu:0",
                                          "gelu_grad:0",
                                          "gelu_grad:1",
                                          "swiglu:0",
                                          "swiglu_grad:0",
                                          "swiglu_grad:1",
                                          "gelu_grad:out0",
                                          "swiglu:out0",
                                          "swiglu_grad:out0",
                                          "moe_dispatch:0",
                                          "moe_dispatch:out0",
                                          "moe_dispatch_grad:1",
                                          "moe_dispatch_grad:out0",
                                          "add:0",
                                          "add:1",
                                          "add:out0",
                                          "moe_combine:0",
                                          "moe_combine:out0",
                                          "moe_combine_grad:0",
                                          "moe_combine_grad:3",
                                          "moe_combine_grad:out0",
                                          "expert_linear:0",
                                          "expert_linear:1",
                                          "expert_linear:out0",
                                          "expert_linear_grad_input:0",
                                          "expert_linear_grad_input:1",
                                          "expert_linear_grad_input:out0",
                                          "expert_linear_grad_weight:0",
                                          "expert_linear_grad_weight:1"};
  CHECK(onGpu == declared);
  CHECK(onCpu == declared);
  CHECK(onFused == declared);
  // What gpu_kernels_gpu_test expects its unlimited run on CUDA to check.
  CHECK(testing::declaredPackedOperands(*gpu) == declared);
  // The CPU device takes none packed (its kernels would unpack and pack
  // them: no pass saved).
  for (const char *op : {"linear", "linear_grad_weight"})
    CHECK_FALSE(cpu->readsPackedInput(*cpu->findKernel(op), 0));
  CHECK_FALSE(
      cpu->writesPackedOutput(*cpu->findKernel("cross_entropy_fused"), 1));
  // A kernel storing an output packed rounds its outputs itself (the
  // executor has no fp32 value to round).
  for (const auto &k : hal::PIPER_GPU_NS::kernels()) {
    INFO("kernel " << k.name);
    CHECK((k.packedOutputs == 0 || k.roundsOutputs));
  }
}

// The step's loss accumulators (hal::LossSums): at least one slot; they
// start at zero, `loss_accumulate` adds to the slot it is given, a read
// gives every slot in order, and a reset zeroes them; on both devices.
TEST_CASE("loss accumulators") {
  auto cpu = createCpuDevice(nullptr);
  auto gpu = createEmulatedGpuDevice(nullptr);
  for (Device *d : {cpu.get(), gpu.get()}) {
    INFO(d->name());
    std::unique_ptr<LossSums> sums;
    CHECK(d->createLossSums(0, sums).message() ==
          "loss accumulators: 0 slots asked for; at least one is needed");
    REQUIRE(d->createLossSums(3, sums));
    // The devices' memory is the host's here.
    float value = 1.5f;
    plan::Kernel kernel;
    kernel.set_op("loss_accumulate");
    (*kernel.mutable_attrs())["scale"].set_f(0.25);
    KernelContext ctx;
    ctx.lossAccumulator = sums->slot(1);
    const KernelInfo *info = d->findKernel("loss_accumulate");
    REQUIRE(info);
    for (int twice = 0; twice < 2; ++twice)
      REQUIRE(d->runKernel(*info, kernel, decodeKernelAttrs(kernel),
                           {TensorRef{plan::F32, {}, &value}}, {}, ctx));
    std::vector<double> out(3, -1.0);
    REQUIRE(sums->read(out.data()));
    CHECK(out == std::vector<double>{0.0, 0.75, 0.0});
    REQUIRE(sums->reset());
    REQUIRE(sums->read(out.data()));
    CHECK(out == std::vector<double>{0.0, 0.0, 0.0});
  }
}

// AdamW's per-step constants live in the stream's constant tables
// (gpu::ConstantTables): a kernel context without them is an error, not a
// launch reading nothing.
TEST_CASE("adamw needs the stream's constant tables") {
  using namespace piper::runtime::hal::PIPER_GPU_NS;
  std::vector<float> g(4, 0.5f), p(4, 1.0f), m(4, 0.0f), v(4, 0.0f);
  plan::Kernel kernel;
  kernel.set_op("adamw");
  (*kernel.mutable_attrs())["lr"].set_f(0.1);
  KernelContext kctx;
  kctx.step = 1;
  auto ref = [](std::vector<float> &x) {
    return TensorRef{plan::F32, {int64_t(x.size())}, x.data()};
  };
  const KernelInfo *info = findKernelInfo("adamw");
  REQUIRE(info);
  Context bare; // no constant tables
  Status st = piper::runtime::hal::PIPER_GPU_NS::runKernel(
      *info, kernel, decodeKernelAttrs(kernel), {ref(g)},
      {ref(p), ref(m), ref(v)}, kctx, bare);
  CHECK(st.message() == "adamw: the kernel context has no constant tables");
  CHECK(p == std::vector<float>(4, 1.0f));
}

#ifdef PIPER_GPU_LANES32
// The 32-lane emulation itself (host/LanesExec.h): lanes exchange values at
// each meeting as a warp does, rows run in reverse, and lanes that diverge
// at a cross-lane operation abort the process with a message (here in a
// child process).
TEST_CASE("the 32-lane emulation meets like a warp and names divergence") {
  using hal::PIPER_GPU_NS::Context;
  using hal::PIPER_GPU_NS::HostExec;
  Context ctx;
  std::vector<int64_t> sums(3, -1), shifted(3 * 32, -1);
  std::vector<int64_t> order;
  REQUIRE(HostExec(ctx).forEachRow(
      "test", 3, [&](const HostExec::Lanes &lanes, int64_t r) {
        int64_t v = lanes.lane() + 100 * r;
        int64_t total = lanes.sum(v);
        int64_t up = lanes.shuffleUp(v, 1);
        if (lanes.lane() == 0) {
          sums[size_t(r)] = total;
          order.push_back(r);
        }
        shifted[size_t(r * 32 + lanes.lane())] = up;
      }));
  for (int64_t r = 0; r < 3; ++r) {
    CHECK(sums[size_t(r)] == 496 + 3200 * r);
    for (int l = 0; l < 32; ++l)
      CHECK(shifted[size_t(r * 32 + l)] == (l > 0 ? l - 1 : 0) + 100 * r);
  }
  CHECK(order == std::vector<int64_t>{2, 1, 0});

  int pipe[2];
  REQUIRE(::pipe(pipe) == 0);
  pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    ::dup2(pipe[1], 2);
    Context c;
    // Lane 7 skips the sum the others wait in.
    (void)HostExec(c).forEachRow("diverging", 1,
                                 [&](const HostExec::Lanes &lanes, int64_t) {
                                   if (lanes.lane() != 7)
                                     (void)lanes.sum(1.0);
                                 });
    ::_exit(0);
  }
  ::close(pipe[1]);
  std::string err;
  char buf[256];
  for (ssize_t n; (n = ::read(pipe[0], buf, sizeof buf)) > 0;)
    err.append(buf, size_t(n));
  ::close(pipe[0]);
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  CHECK(WIFSIGNALED(status));
  CHECK(WTERMSIG(status) == SIGABRT);
  CHECK(err.find("lanes diverged") != std::string::npos);
}
#endif

// A captured step's all-to-all moves its rows through blocks of a fixed
// size (Device::packRowBlocks, unpackRowBlocks): each member's rows into
// its block, and back in member order with the rest zeroed; counts that do
// not fit leave their fault code (the first one) and move nothing. Rows of
// 8, 6 and 3 bytes (the copies' 4-, 2- and 1-byte units).
TEST_CASE("a captured all-to-all's row blocks") {
  auto gpu = createEmulatedGpuDevice(nullptr);
  Allocator &mem = gpu->allocator();
  using Fault = RowBlockFault;
  for (int64_t rowBytes : {8, 6, 3}) {
    INFO("rows of " << rowBytes << " bytes");
    RowBlocks shape;
    shape.members = 3;
    shape.blockRows = 2;
    shape.rows = 5;
    shape.rowBytes = rowBytes;
    const size_t inBytes = static_cast<size_t>(5 * rowBytes),
                 blockBytes = static_cast<size_t>(3 * 2 * rowBytes);
    std::vector<uint8_t> input(inBytes);
    for (size_t b = 0; b < inBytes; ++b)
      input[b] = static_cast<uint8_t>(b + 1);
    void *in = nullptr, *blocks = nullptr, *out = nullptr, *counts = nullptr,
         *sent = nullptr, *fault = nullptr;
    REQUIRE(mem.allocate(inBytes, in));
    REQUIRE(mem.allocate(blockBytes, blocks));
    REQUIRE(mem.allocate(inBytes, out));
    REQUIRE(mem.allocate(3 * sizeof(int32_t), counts));
    REQUIRE(mem.allocate(3 * sizeof(int32_t), sent));
    REQUIRE(mem.allocate(sizeof(int32_t), fault));
    REQUIRE(mem.copyFromHost(in, input.data(), inBytes));
    auto setCounts = [&](std::vector<int32_t> c) {
      REQUIRE(mem.copyFromHost(counts, c.data(), 3 * sizeof(int32_t)));
    };
    auto setFault = [&](int32_t code) {
      REQUIRE(mem.copyFromHost(fault, &code, sizeof code));
    };
    auto faultCode = [&] {
      int32_t code = -7;
      REQUIRE(mem.copyToHost(&code, fault, sizeof code));
      return code;
    };
    auto sentCounts = [&] {
      std::vector<int32_t> c(3);
      REQUIRE(mem.copyToHost(c.data(), sent, 3 * sizeof(int32_t)));
      return c;
    };
    auto bytesOf = [&](void *p, size_t n) {
      std::vector<uint8_t> b(n);
      REQUIRE(mem.copyToHost(b.data(), p, n));
      return b;
    };
    const int32_t *countsIn = static_cast<const int32_t *>(counts);
    int32_t *faultAt = static_cast<int32_t *>(fault),
            *sentAt = static_cast<int32_t *>(sent);
    const size_t row = static_cast<size_t>(rowBytes);

    // Members 0 and 2 get 2 rows each, member 1 none; the blocks come back
    // as the input's first 4 rows and a zero row.
    setCounts({2, 0, 2});
    setFault(0);
    std::vector<uint8_t> marked(blockBytes, 0xEE);
    REQUIRE(mem.copyFromHost(blocks, marked.data(), blockBytes));
    REQUIRE(gpu->packRowBlocks(shape, in, countsIn, blocks, sentAt, faultAt));
    CHECK(faultCode() == 0);
    CHECK(sentCounts() == std::vector<int32_t>{2, 0, 2});
    std::vector<uint8_t> want = marked;
    std::copy_n(input.begin(), 2 * row, want.begin());
    std::copy_n(input.begin() + 2 * row, 2 * row, want.begin() + 4 * row);
    CHECK(bytesOf(blocks, blockBytes) == want);
    REQUIRE(gpu->unpackRowBlocks(shape, blocks, sentAt, out, faultAt));
    CHECK(faultCode() == 0);
    std::vector<uint8_t> back(inBytes, 0);
    std::copy_n(input.begin(), 4 * row, back.begin());
    CHECK(bytesOf(out, inBytes) == back);

    // Counts that do not fit: each one's code, -1 sent to every member,
    // nothing moved.
    struct Bad {
      std::vector<int32_t> counts;
      Fault fault;
    };
    for (const Bad &bad :
         {Bad{{3, 0, 0}, Fault::kCount}, Bad{{0, -1, 0}, Fault::kCount},
          Bad{{2, 2, 2}, Fault::kInput}}) {
      INFO("sending " << bad.counts[0] << ", " << bad.counts[1] << ", "
                      << bad.counts[2]);
      setCounts(bad.counts);
      setFault(0);
      REQUIRE(mem.copyFromHost(blocks, marked.data(), blockBytes));
      REQUIRE(gpu->packRowBlocks(shape, in, countsIn, blocks, sentAt, faultAt));
      CHECK(faultCode() == int32_t(bad.fault));
      CHECK(sentCounts() == std::vector<int32_t>{-1, -1, -1});
      CHECK(bytesOf(blocks, blockBytes) == marked);
    }
    // Received counts that do not fit: each one's code, an all-zero output.
    REQUIRE(mem.copyFromHost(out, input.data(), inBytes));
    for (const Bad &bad :
         {Bad{{2, -1, 2}, Fault::kPeer}, Bad{{0, 3, 0}, Fault::kCount},
          Bad{{2, 2, 2}, Fault::kOutput}}) {
      INFO("receiving " << bad.counts[0] << ", " << bad.counts[1] << ", "
                        << bad.counts[2]);
      setCounts(bad.counts);
      setFault(0);
      REQUIRE(gpu->unpackRowBlocks(shape, blocks, countsIn, out, faultAt));
      CHECK(faultCode() == int32_t(bad.fault));
      CHECK(bytesOf(out, inBytes) == std::vector<uint8_t>(inBytes, 0));
    }
    // The first fault stays.
    setCounts({3, 0, 0});
    setFault(int32_t(Fault::kOutput));
    REQUIRE(gpu->packRowBlocks(shape, in, countsIn, blocks, sentAt, faultAt));
    CHECK(faultCode() == int32_t(Fault::kOutput));
    for (void *p : {in, blocks, out})
      mem.deallocate(p, p == blocks ? blockBytes : inBytes);
    for (void *p : {counts, sent})
      mem.deallocate(p, 3 * sizeof(int32_t));
    mem.deallocate(fault, sizeof(int32_t));
  }
  // A device that does not capture steps has no blocks.
  auto cpu = createCpuDevice(nullptr);
  CHECK(cpu->packRowBlocks({}, nullptr, nullptr, nullptr, nullptr, nullptr)
            .message() == "the cpu backend does not capture steps");
  CHECK(
      cpu->unpackRowBlocks({}, nullptr, nullptr, nullptr, nullptr).message() ==
      "the cpu backend does not capture steps");
}
