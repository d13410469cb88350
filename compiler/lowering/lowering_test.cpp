// Unit tests of the lowering to plans: every kernel it emits is checked
// against the kernel table (proto/KernelIds.h), and an op with no kernel
// there is an error naming the op.
#include <catch2/catch.hpp>

#include <string>
#include <utility>
#include <vector>

#include "compiler/lowering/LowerToPlan.h"
#include "compiler/transforms/Transforms.h"
#include "dialects/piper/PiperDialect.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Parser/Parser.h"
#include "proto/KernelIds.h"

using namespace mlir;
using namespace mlir::piper;

namespace {

/// A one-rank device program running segment @f once, whose body is `body`
/// (from %x, parameter @w: tensor<2x4xf32>, to %y: tensor<2x4xf32>).
std::string program(const std::string &body) {
  return R"(
piper.param @w : tensor<2x4xf32> init zeros(0.0)
piper.segment @f() -> tensor<2x4xf32> {
  %x = piper.param_ref @w : tensor<2x4xf32>
)" + body +
         R"(
  piper.yield %y : tensor<2x4xf32>
}
piper.device_program @class0 attributes {device_class = 0 : i64, ranks = array<i64: 0>} {
  %y, %yd = piper.task @f() {devices = #piper.group<0>, stream = #piper.stream<"compute", compute>, tag = #piper.tag<PP = 0, MB = 0, PASS = F>} : () -> (tensor<2x4xf32>, !piper.token)
}
)";
}

/// Lowers the device programs of `source` (ordering their streams first
/// when `order`, as piperc does); returns the diagnostics, and the lowered
/// plans in `lowered` when the lowering succeeds.
std::string lowerAll(const std::string &source, bool order,
                     FailureOr<LoweredPlans> &lowered, bool fuse = false) {
  MLIRContext ctx;
  ctx.loadDialect<PiperDialect>();
  ctx.allowUnregisteredDialects();
  ctx.printOpOnDiagnostic(false);
  std::string diagnostics;
  ScopedDiagnosticHandler handler(&ctx, [&](Diagnostic &d) {
    diagnostics += d.str() + "\n";
    return success();
  });
  OwningOpRef<ModuleOp> module = parseSourceString<ModuleOp>(source, &ctx);
  INFO(diagnostics);
  REQUIRE(module);
  if (order)
    REQUIRE(succeeded(orderStreams(*module)));
  lowered = lowerToPlans(*module, "test", "test", /*checkProgress=*/true, fuse);
  CHECK(failed(lowered) == !diagnostics.empty());
  return diagnostics;
}

/// Lowers `source`; returns the diagnostics, and the plan of class 0 in
/// `plan` when the lowering succeeds.
std::string lower(const std::string &source, bool &ok, plan::Plan &plan) {
  FailureOr<LoweredPlans> lowered = failure();
  std::string diagnostics = lowerAll(source, /*order=*/false, lowered);
  ok = succeeded(lowered);
  if (ok) {
    REQUIRE(lowered->plans.size() == 1);
    plan = lowered->plans[0];
  }
  return diagnostics;
}

/// Lowers `source` (one plan) with or without the segment fusions; returns
/// the ops of its first segment's kernels, each checked against the kernel
/// table, and the segment.
std::pair<std::vector<std::string>, plan::Segment>
segmentKernels(const std::string &source, bool fuse) {
  FailureOr<LoweredPlans> lowered = failure();
  std::string diags = lowerAll(source, /*order=*/false, lowered, fuse);
  INFO(diags);
  REQUIRE(succeeded(lowered));
  const plan::Segment &seg = lowered->plans[0].segments(0);
  std::vector<std::string> ops;
  for (const plan::Kernel &k : seg.kernels()) {
    CHECK(plan::checkKernelSignature(k) == "");
    ops.push_back(k.op());
  }
  return std::make_pair(ops, seg);
}

} // namespace

TEST_CASE("the lowering emits kernels of the kernel table", "[lowering]") {
  bool ok = false;
  plan::Plan plan;
  std::string diags =
      lower(program("  %y = piper.gelu %x : tensor<2x4xf32>"), ok, plan);
  INFO(diags);
  REQUIRE(ok);
  REQUIRE(plan.segments_size() == 1);
  REQUIRE(plan.segments(0).kernels_size() == 1);
  CHECK(plan.segments(0).kernels(0).op() == "gelu");
  CHECK(plan::checkKernelSignature(plan.segments(0).kernels(0)) == "");
}

TEST_CASE("the lowering rejects an op with no kernel, naming it",
          "[lowering]") {
  bool ok = true;
  plan::Plan plan;
  std::string diags =
      lower(program("  %y = \"test.conv2d\"(%x) : (tensor<2x4xf32>) -> "
                    "tensor<2x4xf32>"),
            ok, plan);
  CHECK_FALSE(ok);
  CHECK(diags == "'test.conv2d' op cannot be lowered to a plan kernel: "
                 "unknown kernel 'conv2d'\n");
}

// The plan-level fusions of GELU with the GEMM before it
// (compiler/lowering/SegmentFusions.cpp): where they apply and where not.
TEST_CASE("the lowering runs gelu and gelu_grad with the GEMM before them "
          "where nothing else needs the GEMM's result",
          "[lowering]") {
  const std::string t = "tensor<4x4xf32>";
  const std::string mm = " : (" + t + ", " + t + ") -> " + t + "\n";
  const std::string source =
      R"(
piper.param @x : tensor<4x4xf32> init zeros(0.0)
piper.param @w : tensor<4x4xf32> init zeros(0.0)
piper.segment @f() -> ()" +
      t + ", " + t + ", " + t + ", " + t + R"() {
  %x = piper.param_ref @x : tensor<4x4xf32>
  %w = piper.param_ref @w : tensor<4x4xf32>
)" + "  %h = piper.linear %x, %w" +
      mm +
      R"(  %a = piper.gelu %h : tensor<4x4xf32>
  %b = piper.gelu %x : tensor<4x4xf32>
)" + "  %p = piper.linear_grad_input %a, %w {transpose_w}" +
      mm +
      R"(  %d = piper.gelu_grad %h, %p : tensor<4x4xf32>
)" + "  %q = piper.linear_grad_input %b, %w" +
      mm +
      R"(  %e = piper.gelu_grad %h, %q : tensor<4x4xf32>
  %f = piper.add %e, %q : tensor<4x4xf32>
)" + "  %r = piper.linear_grad_input %d, %w" +
      mm +
      R"(  piper.adamw @w {lr = 1.0e-03 : f64, beta1 = 0.9 : f64, beta2 = 0.95 : f64, eps = 1.0e-08 : f64, weight_decay = 0.0 : f64}
  %g = piper.gelu_grad %h, %r : tensor<4x4xf32>
  piper.yield %h, %d, %f, %g : )" +
      t + ", " + t + ", " + t + ", " + t + R"(
}
piper.device_program @class0 attributes {device_class = 0 : i64, ranks = array<i64: 0>} {
  %h, %d, %f, %g, %t = piper.task @f() {devices = #piper.group<0>, stream = #piper.stream<"compute", compute>, tag = #piper.tag<PP = 0, MB = 0, PASS = F>} : () -> ()" +
      t + ", " + t + ", " + t + ", " + t + R"(, !piper.token)
}
)";
  auto [apart, apartSeg] = segmentKernels(source, false);
  CHECK(apart == std::vector<std::string>{
                     "linear", "gelu", "gelu", "linear_grad_input", "gelu_grad",
                     "linear_grad_input", "gelu_grad", "add",
                     "linear_grad_input", "adamw", "gelu_grad"});
  auto [fused, seg] = segmentKernels(source, true);
  // %h + %a in one kernel (h still the segment's result); %b reads no
  // GEMM; %p's only use is %d's gelu_grad; %q has another use (the add);
  // the adamw between %r and %g may change the weight.
  CHECK(fused == std::vector<std::string>{
                     "linear_gelu", "gelu", "linear_grad_input_gelu",
                     "linear_grad_input", "gelu_grad", "add",
                     "linear_grad_input", "adamw", "gelu_grad"});
  REQUIRE(seg.kernels_size() == 9);
  const plan::Kernel &lg = seg.kernels(0), &lgi = seg.kernels(2);
  // linear_gelu: (x, w) -> (h, a); the segment's first result is its h.
  REQUIRE(lg.outputs_size() == 2);
  CHECK(seg.results(0) == lg.outputs(0).index());
  // linear_grad_input_gelu: (a, w, h) -> d, the segment's second result,
  // with the linear_grad_input's transpose_w.
  REQUIRE(lgi.inputs_size() == 3);
  CHECK(lgi.inputs(0).index() == lg.outputs(1).index());
  CHECK(lgi.inputs(1).kind() == plan::Operand::PARAM);
  CHECK(lgi.inputs(2).index() == lg.outputs(0).index());
  CHECK(seg.results(1) == lgi.outputs(0).index());
  CHECK(lgi.attrs().at("transpose_w").i() == 1);
}

// The plan-level fusions of the residual stream's add with the norms
// (compiler/lowering/SegmentFusions.cpp): where they apply and where not.
TEST_CASE("the lowering runs the residual stream's add with the norm after "
          "it and the norm's input gradient before it",
          "[lowering]") {
  const std::string t = "tensor<4x4xf32>", v = "tensor<4xf32>";
  const std::string ln = " : (" + t + ", " + v + ", " + v + ") -> " + t + "\n";
  const std::string rms = " : (" + t + ", " + v + ") -> " + t + "\n";
  const std::string grad =
      " : (" + t + ", " + v + ", " + t + ") -> " + t + "\n";
  const std::string add = " : " + t + "\n";
  const std::string results = t + ", " + t + ", " + t + ", " + t + ", " + t;
  const std::string source =
      R"(
piper.param @x : tensor<4x4xf32> init zeros(0.0)
piper.param @r : tensor<4x4xf32> init zeros(0.0)
piper.param @g : tensor<4xf32> init zeros(0.0)
piper.param @b : tensor<4xf32> init zeros(0.0)
piper.segment @f() -> ()" +
      results + R"() {
  %x = piper.param_ref @x : tensor<4x4xf32>
  %r = piper.param_ref @r : tensor<4x4xf32>
  %g = piper.param_ref @g : tensor<4xf32>
  %b = piper.param_ref @b : tensor<4xf32>
)" + "  %s = piper.add %x, %r" +
      add + "  %y = piper.layer_norm %s, %g, %b {eps = 0.5 : f64}" + ln +
      "  %s2 = piper.add %y, %r" + add + "  %u = piper.gelu %s2" + add +
      "  %y2 = piper.rms_norm %s2, %g" + rms +
      "  %d = piper.layer_norm_grad_input %x, %g, %y2" + grad +
      "  %e = piper.add %u, %d" + add +
      "  %d2 = piper.rms_norm_grad_input %x, %g, %e" + grad +
      "  %e2 = piper.add %d2, %d2" + add +
      "  %d3 = piper.rms_norm_grad_input %x, %g, %e2 {eps = 0.25 : f64}" +
      grad +
      R"(  piper.adamw @g {lr = 1.0e-03 : f64, beta1 = 0.9 : f64, beta2 = 0.95 : f64, eps = 1.0e-08 : f64, weight_decay = 0.0 : f64}
)" + "  %e3 = piper.add %d3, %e2" +
      add + "  %d4 = piper.rms_norm_grad_input %x, %g, %e3 {eps = 0.25 : f64}" +
      grad + "  %e4 = piper.add %r, %d4" + add +
      "  %y4 = piper.rms_norm %e4, %g" + rms +
      "  piper.yield %s, %y, %e, %e4, %y4 : " + results + R"(
}
piper.device_program @class0 attributes {device_class = 0 : i64, ranks = array<i64: 0>} {
  %s, %y, %e, %e4, %y4, %t = piper.task @f() {devices = #piper.group<0>, stream = #piper.stream<"compute", compute>, tag = #piper.tag<PP = 0, MB = 0, PASS = F>} : () -> ()" +
      results + R"(, !piper.token)
}
)";
  auto [apart, apartSeg] = segmentKernels(source, false);
  CHECK(apart == std::vector<std::string>{
                     "add", "layer_norm", "add", "gelu", "rms_norm",
                     "layer_norm_grad_input", "add", "rms_norm_grad_input",
                     "add", "rms_norm_grad_input", "adamw", "add",
                     "rms_norm_grad_input", "add", "rms_norm"});
  auto [fused, seg] = segmentKernels(source, true);
  // %s's norm follows it; %s2 is read by the gelu before its norm; %d's
  // only use is %e's add; %d2 is added to itself (two uses); the adamw
  // between %d3 and %e3 may change gamma; %e4 is an add of both kinds,
  // and goes to the backward's fusion.
  CHECK(fused == std::vector<std::string>{
                     "add_layer_norm", "add", "gelu", "rms_norm",
                     "layer_norm_grad_input_add", "rms_norm_grad_input", "add",
                     "rms_norm_grad_input", "adamw", "add",
                     "rms_norm_grad_input_add", "rms_norm"});
  REQUIRE(seg.kernels_size() == 12);
  // add_layer_norm: (x, r, g, b) -> (s, y), the segment's first two
  // results, with the norm's eps.
  const plan::Kernel &aln = seg.kernels(0);
  REQUIRE(aln.inputs_size() == 4);
  REQUIRE(aln.outputs_size() == 2);
  for (int i = 0; i < 4; ++i)
    CHECK(aln.inputs(i).kind() == plan::Operand::PARAM);
  CHECK(aln.inputs(0).index() != aln.inputs(1).index());
  CHECK(seg.results(0) == aln.outputs(0).index());
  CHECK(seg.results(1) == aln.outputs(1).index());
  CHECK(aln.attrs().at("eps").f() == 0.5);
  // layer_norm_grad_input_add: (x, g, y2, u) -> e, the third result.
  const plan::Kernel &lga = seg.kernels(4);
  REQUIRE(lga.inputs_size() == 4);
  CHECK(lga.inputs(2).index() == seg.kernels(3).outputs(0).index());
  CHECK(lga.inputs(3).index() == seg.kernels(2).outputs(0).index());
  CHECK(seg.results(2) == lga.outputs(0).index());
  // rms_norm_grad_input_add: (x, g, e3, r) -> e4, with the grad's eps.
  const plan::Kernel &rga = seg.kernels(10);
  REQUIRE(rga.inputs_size() == 4);
  CHECK(rga.inputs(2).index() == seg.kernels(9).outputs(0).index());
  CHECK(rga.inputs(3).kind() == plan::Operand::PARAM);
  CHECK(seg.results(3) == rga.outputs(0).index());
  CHECK(rga.attrs().at("eps").f() == 0.25);
}

// The norms' weight gradients added to their accumulators by their kernel
// (compiler/lowering/SegmentFusions.cpp): only when every result of the
// kernel goes to its parameter's accumulate_grad alone, nothing between
// naming the parameter.
TEST_CASE("the lowering accumulates the norms' weight gradients in their "
          "kernel where each goes to its accumulator alone",
          "[lowering]") {
  const std::string t = "tensor<4x4xf32>", v = "tensor<4xf32>";
  const std::string ln =
      " : (" + t + ", " + t + ") -> (" + v + ", " + v + ")\n";
  const std::string rms = " : (" + t + ", " + t + ") -> " + v + "\n";
  const std::string source =
      std::string(R"(
piper.param @x : tensor<4x4xf32> init zeros(0.0)
piper.param @g : tensor<4xf32> init zeros(0.0)
piper.param @b : tensor<4xf32> init zeros(0.0)
piper.param @h : tensor<4xf32> init zeros(0.0)
piper.segment @f() -> (tensor<4xf32>) {
  %x = piper.param_ref @x : tensor<4x4xf32>
)") + "  %dg, %db = piper.layer_norm_grad_weight %x, %x" +
      ln + R"(  piper.accumulate_grad @b, %db : tensor<4xf32>
  piper.accumulate_grad @g, %dg : tensor<4xf32>
)" + "  %dh = piper.rms_norm_grad_weight %x, %x" +
      rms + R"(  piper.zero_grad @h
  piper.accumulate_grad @h, %dh : tensor<4xf32>
)" + "  %dg2, %db2 = piper.layer_norm_grad_weight %x, %x" +
      ln + R"(  piper.accumulate_grad @g, %dg2 : tensor<4xf32>
)" + "  %dh2 = piper.rms_norm_grad_weight %x, %x" +
      rms + R"(  piper.accumulate_grad @h, %dh2 : tensor<4xf32>
  piper.yield %db2 : tensor<4xf32>
}
piper.device_program @class0 attributes {device_class = 0 : i64, ranks = array<i64: 0>} {
  %y, %t = piper.task @f() {devices = #piper.group<0>, stream = #piper.stream<"compute", compute>, tag = #piper.tag<PP = 0, MB = 0, PASS = F>} : () -> (tensor<4xf32>, !piper.token)
}
)";
  auto [apart, apartSeg] = segmentKernels(source, false);
  CHECK(apart == std::vector<std::string>{
                     "layer_norm_grad_weight", "accumulate", "accumulate",
                     "rms_norm_grad_weight", "zero", "accumulate",
                     "layer_norm_grad_weight", "accumulate",
                     "rms_norm_grad_weight", "accumulate"});
  auto [fused, seg] = segmentKernels(source, true);
  // The first kernel adds both gradients; the zero_grad between %dh and its
  // accumulation names @h; %db2 is also the segment's result; the last
  // accumulates.
  CHECK(fused == std::vector<std::string>{
                     "layer_norm_grad_weight", "rms_norm_grad_weight", "zero",
                     "accumulate", "layer_norm_grad_weight", "accumulate",
                     "rms_norm_grad_weight"});
  REQUIRE(seg.kernels_size() == 7);
  const plan::Kernel &both = seg.kernels(0), &last = seg.kernels(6);
  CHECK(both.attrs().at("accumulate").i() == 1);
  REQUIRE(both.outputs_size() == 2);
  CHECK(both.outputs(0).kind() == plan::Operand::GRAD);
  CHECK(both.outputs(1).kind() == plan::Operand::GRAD);
  // dgamma to @g's accumulator, dbeta to @b's (the parameters numbered as
  // the unfused lowering meets them: @x, @b, @g, @h).
  CHECK(both.outputs(0).index() == 2);
  CHECK(both.outputs(1).index() == 1);
  CHECK(seg.kernels(1).attrs().count("accumulate") == 0);
  CHECK(seg.kernels(4).attrs().count("accumulate") == 0);
  CHECK(last.attrs().at("accumulate").i() == 1);
  CHECK(last.outputs(0).kind() == plan::Operand::GRAD);
  CHECK(last.outputs(0).index() == 3);
}

TEST_CASE("the lowering accumulates the embeddings' gradients in their "
          "kernels",
          "[lowering]") {
  const std::string source = R"(
piper.param @wte : tensor<16x4xf32> init zeros(0.0)
piper.param @wpe : tensor<4x4xf32> init zeros(0.0)
piper.segment @f(%tok: tensor<2x4xi32>) -> tensor<4x4xf32> {
  %x = piper.param_ref @wpe : tensor<4x4xf32>
  %dy = piper.add %x, %x : tensor<4x4xf32>
  %dwte = piper.embedding_grad %tok, %dy : (tensor<2x4xi32>, tensor<4x4xf32>) -> tensor<16x4xf32>
  %dwpe = piper.position_add_grad %dy {seq = 4 : i64} : (tensor<4x4xf32>) -> tensor<4x4xf32>
  piper.accumulate_grad @wte, %dwte : tensor<16x4xf32>
  piper.accumulate_grad @wpe, %dwpe : tensor<4x4xf32>
  %dwpe2 = piper.position_add_grad %dy {seq = 4 : i64} : (tensor<4x4xf32>) -> tensor<4x4xf32>
  piper.zero_grad @wpe
  piper.accumulate_grad @wpe, %dwpe2 : tensor<4x4xf32>
  piper.yield %dy : tensor<4x4xf32>
}
piper.device_program @class0 attributes {device_class = 0 : i64, ranks = array<i64: 0>} {
  %tok, %tgt, %bd = piper.batch {tag = #piper.tag<MB = 0>} : tensor<2x4xi32>, tensor<2x4xi32>
  %y, %t = piper.task @f(%tok) {devices = #piper.group<0>, stream = #piper.stream<"compute", compute>, tag = #piper.tag<PP = 0, MB = 0, PASS = F>} : (tensor<2x4xi32>) -> (tensor<4x4xf32>, !piper.token)
}
)";
  auto [apart, apartSeg] = segmentKernels(source, false);
  CHECK(apart == std::vector<std::string>{
                     "add", "embedding_grad", "position_add_grad", "accumulate",
                     "accumulate", "position_add_grad", "zero", "accumulate"});
  auto [fused, seg] = segmentKernels(source, true);
  // Both gradients go to their accumulators; the zero_grad between the
  // last one and its accumulation names @wpe.
  CHECK(fused ==
        std::vector<std::string>{"add", "embedding_grad", "position_add_grad",
                                 "position_add_grad", "zero", "accumulate"});
  REQUIRE(seg.kernels_size() == 6);
  for (int k : {1, 2}) {
    const plan::Kernel &g = seg.kernels(k);
    CHECK(g.attrs().at("accumulate").i() == 1);
    REQUIRE(g.outputs_size() == 1);
    CHECK(g.outputs(0).kind() == plan::Operand::GRAD);
  }
  // @wte's and @wpe's accumulators (the parameters numbered as the unfused
  // lowering meets them: @wpe, @wte).
  CHECK(seg.kernels(1).outputs(0).index() == 1);
  CHECK(seg.kernels(2).outputs(0).index() == 0);
  CHECK(seg.kernels(3).attrs().count("accumulate") == 0);
  CHECK(seg.kernels(3).outputs(0).kind() == plan::Operand::VALUE);
}

/// Orders and lowers `source` (device programs of any number of classes) as
/// piperc does; returns the diagnostics, empty when the lowering succeeds.
static std::string orderAndLower(const std::string &source) {
  FailureOr<LoweredPlans> lowered = failure();
  return lowerAll(source, /*order=*/true, lowered);
}

// The plan simulator is the compiler's one model of cross-device progress
// (docs/compiler.md, "One progress model"): device programs that cannot
// finish a step together are refused when their plans are written, with
// the simulator's words for what each blocked stream waits for.
TEST_CASE("the lowering refuses device programs that deadlock, naming what "
          "each stream waits for",
          "[lowering]") {
  const std::string segF = R"(
piper.segment @f(%x: tensor<2x4xf32>) -> tensor<2x4xf32> {
  piper.yield %x : tensor<2x4xf32>
}
)";
  SECTION("each class receives before it sends what the other receives") {
    std::string error = orderAndLower(segF + R"(
piper.device_program @class0 attributes {device_class = 0 : i64, ranks = array<i64: 0>} {
  %a, %ad = piper.recv {channel = 1 : i64, peers = #piper.group<1>, stream = #piper.stream<"pp_stream", comm>} : tensor<2x4xf32>
  %x, %xd = piper.task @f(%a) {devices = #piper.group<0>, stream = #piper.stream<"compute", compute>, tag = #piper.tag<PP = 0, MB = 0, PASS = F>} : (tensor<2x4xf32>) -> (tensor<2x4xf32>, !piper.token)
  %s = piper.send %x {channel = 0 : i64, peers = #piper.group<1>, stream = #piper.stream<"pp_stream", comm>} : tensor<2x4xf32>
}
piper.device_program @class1 attributes {device_class = 1 : i64, ranks = array<i64: 1>} {
  %b, %bd = piper.recv {channel = 0 : i64, peers = #piper.group<0>, stream = #piper.stream<"pp_stream", comm>} : tensor<2x4xf32>
  %y, %yd = piper.task @f(%b) {devices = #piper.group<1>, stream = #piper.stream<"compute", compute>, tag = #piper.tag<PP = 1, MB = 0, PASS = F>} : (tensor<2x4xf32>) -> (tensor<2x4xf32>, !piper.token)
  %s = piper.send %y {channel = 1 : i64, peers = #piper.group<0>, stream = #piper.stream<"pp_stream", comm>} : tensor<2x4xf32>
}
)");
    INFO(error);
    CHECK(error.find("the device programs cannot finish a step: the plans "
                     "cannot finish the step (deadlock): ") == 0);
    CHECK(error.find("class 0, stream 'pp_stream', instruction 0 (") !=
          std::string::npos);
    CHECK(error.find("class 1, stream 'pp_stream', instruction 0 (") !=
          std::string::npos);
  }
  SECTION("a receive whose send no class issues") {
    std::string error = orderAndLower(segF + R"(
piper.param @w : tensor<2x4xf32> init zeros(0.0)
piper.segment @e() -> tensor<2x4xf32> {
  %w = piper.param_ref @w : tensor<2x4xf32>
  %y = piper.gelu %w : tensor<2x4xf32>
  piper.yield %y : tensor<2x4xf32>
}
piper.device_program @class0 attributes {device_class = 0 : i64, ranks = array<i64: 0>} {
  %a, %ad = piper.recv {channel = 7 : i64, peers = #piper.group<1>, stream = #piper.stream<"activations", comm>} : tensor<2x4xf32>
  %x, %xd = piper.task @f(%a) {devices = #piper.group<0>, stream = #piper.stream<"compute", compute>, tag = #piper.tag<PP = 0, MB = 0, PASS = F>} : (tensor<2x4xf32>) -> (tensor<2x4xf32>, !piper.token)
}
piper.device_program @class1 attributes {device_class = 1 : i64, ranks = array<i64: 1>} {
  %y, %yd = piper.task @e() {devices = #piper.group<1>, stream = #piper.stream<"compute", compute>, tag = #piper.tag<PP = 1, MB = 0, PASS = F>} : () -> (tensor<2x4xf32>, !piper.token)
}
)");
    INFO(error);
    CHECK(error.find("the device programs cannot finish a step: the plans "
                     "cannot finish the step (deadlock): ") == 0);
    CHECK(error.find("class 0, stream 'activations', instruction 0 (") !=
          std::string::npos);
    CHECK(error.find("which class 1 never issues on a stream named "
                     "'activations'") != std::string::npos);
  }
  SECTION("a world-wide clip that one class reaches only after another's "
          "send it waits for") {
    std::string error = orderAndLower(R"(
piper.param @w : tensor<2x4xf32> init zeros(0.0)
piper.segment @f() -> tensor<2x4xf32> {
  %w = piper.param_ref @w : tensor<2x4xf32>
  %y = piper.gelu %w : tensor<2x4xf32>
  piper.yield %y : tensor<2x4xf32>
}
piper.segment @g(%x: tensor<2x4xf32>) {
  piper.yield
}
piper.device_program @class0 attributes {device_class = 0 : i64, ranks = array<i64: 0>} {
  %c = piper.clip_grads {max_norm = 1.0 : f64}
  %x, %d = piper.task @f() after(%c) {devices = #piper.group<0>, stream = #piper.stream<"compute", compute>, tag = #piper.tag<PP = 0, PASS = U>} : () -> (tensor<2x4xf32>, !piper.token)
  %s = piper.send %x {channel = 0 : i64, peers = #piper.group<1>, stream = #piper.stream<"pp_stream", comm>} : tensor<2x4xf32>
}
piper.device_program @class1 attributes {device_class = 1 : i64, ranks = array<i64: 1>} {
  %r, %rd = piper.recv {channel = 0 : i64, peers = #piper.group<0>, stream = #piper.stream<"pp_stream", comm>} : tensor<2x4xf32>
  %d = piper.task @g(%r) {devices = #piper.group<1>, stream = #piper.stream<"compute", compute>, tag = #piper.tag<PP = 1, PASS = B>} : (tensor<2x4xf32>) -> !piper.token
  %c = piper.clip_grads after(%d) {max_norm = 1.0 : f64}
}
)");
    INFO(error);
    CHECK(error.find("the device programs cannot finish a step: the plans "
                     "cannot finish the step (deadlock): ") == 0);
    CHECK(error.find("the world's CLIP_GRADS") != std::string::npos);
  }
}
