// Benchmark of the executor's own dispatch cost: plans of thousands of tiny
// kernels (4-element adds), timed per kernel inside one CALL and per CALL
// instruction of a one-kernel segment. Run by bench/executor_overhead.sh.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "proto/PlanFile.h"
#include "proto/analysis/MemoryPlan.h"
#include "runtime/exec/Executor.h"

using namespace piper;
using namespace piper::runtime;

namespace {

plan::TensorType vec4() {
  plan::TensorType t;
  t.set_dtype(plan::F32);
  t.add_shape(4);
  return t;
}

plan::Operand value(int index) {
  plan::Operand o;
  o.set_kind(plan::Operand::VALUE);
  o.set_index(index);
  return o;
}

/// A segment of one `zero` then `adds` chained adds: v[i+1] = v[i] + v[0].
void addChainSegment(plan::Plan &plan, const std::string &name, int adds) {
  plan::Segment *seg = plan.add_segments();
  seg->set_name(name);
  for (int v = 0; v <= adds; ++v)
    *seg->add_values() = vec4();
  plan::Kernel *zero = seg->add_kernels();
  zero->set_op("zero");
  *zero->add_outputs() = value(0);
  for (int i = 0; i < adds; ++i) {
    plan::Kernel *add = seg->add_kernels();
    add->set_op("add");
    *add->add_inputs() = value(i == 0 ? 0 : i);
    *add->add_inputs() = value(0);
    *add->add_outputs() = value(i + 1);
  }
}

/// One stream of `calls` CALLs of a segment with `kernelsPerCall` kernels.
plan::Plan makePlan(int calls, int kernelsPerCall) {
  plan::Plan plan;
  plan.set_schema_version(plan::kPlanSchemaVersion);
  plan.add_ranks(0);
  plan.set_world_size(1);
  plan.set_model_name("executor-overhead");
  plan.mutable_training()->set_vocab_size(16);
  addChainSegment(plan, "tiny", kernelsPerCall - 1);
  plan::Stream *stream = plan.add_streams();
  stream->set_name("compute");
  for (int c = 0; c < calls; ++c) {
    plan::Instruction *inst = stream->add_instructions();
    inst->set_kind(plan::Instruction::CALL);
    inst->set_segment(0);
  }
  std::string error;
  if (!plan::assignArena(plan, error)) {
    std::fprintf(stderr, "executor_overhead: %s\n", error.c_str());
    std::exit(1);
  }
  return plan;
}

/// Microseconds per kernel of running `plan` for `steps` steps after one
/// warm-up step.
double microsPerKernel(const plan::Plan &plan, int steps) {
  ExecutorOptions options;
  Status status;
  auto exec = Executor::create(plan, options, status);
  if (!exec) {
    std::fprintf(stderr, "executor_overhead: %s\n", status.message().c_str());
    std::exit(1);
  }
  double loss = 0;
  if (!(status = exec->runStep(1, loss))) {
    std::fprintf(stderr, "executor_overhead: %s\n", status.message().c_str());
    std::exit(1);
  }
  int64_t kernels = 0;
  for (const plan::Instruction &inst : plan.streams(0).instructions())
    kernels += plan.segments(inst.segment()).kernels_size();
  auto start = std::chrono::steady_clock::now();
  for (int t = 2; t <= steps + 1; ++t)
    if (!(status = exec->runStep(t, loss))) {
      std::fprintf(stderr, "executor_overhead: %s\n", status.message().c_str());
      std::exit(1);
    }
  double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  return seconds * 1e6 / double(kernels * steps);
}

} // namespace

int main(int argc, char **argv) {
  int steps = argc > 1 ? std::atoi(argv[1]) : 20;
  // 4,000 kernels in one CALL: the kernel loop.
  double perKernel = microsPerKernel(makePlan(1, 4000), steps);
  // 4,000 CALLs of a one-kernel segment: the whole instruction path.
  double perCall = microsPerKernel(makePlan(4000, 1), steps);
  std::printf("piper_kernel_in_call_us %.3f\n", perKernel);
  std::printf("piper_call_instruction_us %.3f\n", perCall);
  return 0;
}
