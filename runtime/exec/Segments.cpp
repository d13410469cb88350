// CALL instructions: value lifetimes inside a segment, kernels resolved
// through the device's registry (and their attributes decoded) once, and the
// per-call kernel loop (with the bf16 parameter copies of mixed precision).
#include <algorithm>

#include "proto/analysis/MemoryPlan.h"
#include "runtime/exec/ExecutorImpl.h"

namespace piper::runtime {

using plan::Instruction;
using plan::Operand;

namespace {

/// Whether `kernel`, the first to touch value `v`, writes all of it before
/// anything reads it: v is one of its outputs and none of its inputs, and
/// the kernel does not read its outputs (kernelReadsOutputs). Such a value
/// is not zeroed first (gpu-speed: most of a GPU step's memsets).
bool firstWriterOverwrites(const plan::Kernel &kernel, int v) {
  if (kernelReadsOutputs(kernel))
    return false;
  bool output = false;
  for (const Operand &o : kernel.outputs())
    output |= o.kind() == Operand::VALUE && o.index() == v;
  for (const Operand &o : kernel.inputs())
    if (o.kind() == Operand::VALUE && o.index() == v)
      return false;
  return output;
}

} // namespace

SegmentLifetimes computeLifetimes(const plan::Segment &seg) {
  // The same kernel spans the memory planner lays the scratch out from.
  plan::KernelSpan span = plan::valueKernelSpans(seg);
  std::vector<char> isArg(seg.values_size(), 0);
  for (int a : seg.args())
    isArg[a] = 1;
  SegmentLifetimes lt;
  lt.allocBefore.resize(seg.kernels_size());
  lt.argsBefore.resize(seg.kernels_size());
  for (int v = 0; v < seg.values_size(); ++v)
    if (!isArg[v] && span.first[v] >= 0 &&
        !firstWriterOverwrites(seg.kernels(span.first[v]), v))
      lt.allocBefore[span.first[v]].push_back(v);
  for (int a = 0; a < seg.args_size(); ++a)
    if (int first = span.first[seg.args(a)]; first >= 0)
      lt.argsBefore[first].push_back(a);
  // An argument that is also a result is stored when the call ends.
  lt.resultsAfter.resize(seg.kernels_size());
  for (int r = 0; r < seg.results_size(); ++r)
    if (int v = seg.results(r); !isArg[v] && span.lastWrite[v] >= 0)
      lt.resultsAfter[span.lastWrite[v]].push_back(r);
  return lt;
}

Status ExecutorImpl::resolveKernels() {
  for (int g = 0; g < plan.segments_size(); ++g) {
    const plan::Segment &seg = plan.segments(g);
    // planStorage resolved each kernel's device entry and storage.
    std::vector<ResolvedKernel> &resolved = kernels[g];
    for (int k = 0; k < seg.kernels_size(); ++k) {
      const plan::Kernel &kernel = seg.kernels(k);
      ResolvedKernel &r = resolved[k];
      r.attrs = decodeKernelAttrs(kernel);
      const std::string &op = kernel.op();
      r.adamw = op == "adamw";
      r.onRange = r.adamw && !kernel.outputs().empty() &&
                  kernel.outputs(0).kind() == Operand::PARAM &&
                  kernel.outputs(0).index() >= 0 &&
                  kernel.outputs(0).index() < plan.params_size() &&
                  zeroSharded(kernel.outputs(0).index());
      if (bf16 && r.adamw && !r.onRange && !kernel.outputs().empty() &&
          kernel.outputs(0).kind() == Operand::PARAM) {
        int p = kernel.outputs(0).index();
        if (p >= 0 && p < plan.params_size() && bf16Params[p])
          r.writesCopyOf = p;
      }
      // Profile rows are the kernel table's (the CPU registry names every
      // op); a device's own KernelInfo indices may differ.
      const KernelInfo *named = runtime::findKernel(op);
      r.profileRow = profiler.kernelRow(named ? named->index : r.info->index);
      auto view = [&](const Operand &o) {
        if (o.kind() == Operand::VALUE) {
          const plan::TensorType &type = seg.values(o.index());
          return TensorRef{
              type.dtype(),
              std::vector<int64_t>(type.shape().begin(), type.shape().end()),
              nullptr};
        }
        if (r.onRange) // elementwise over this rank's range
          return TensorRef{plan::F32, {shard[o.index()].count}, nullptr};
        TensorRef ref = stateOf(o.index(), o.kind())->ref();
        ref.data = nullptr;
        return ref;
      };
      for (const Operand &o : kernel.inputs())
        r.inputs.push_back(view(o));
      for (const Operand &o : kernel.outputs())
        r.outputs.push_back(view(o));
    }
    // Runs of consecutive updates, run together.
    const SegmentLifetimes &lt = lifetimes[static_cast<size_t>(g)];
    auto groupable = [&](int k) {
      return resolved[k].adamw && lt.allocBefore[k].empty() &&
             lt.argsBefore[k].empty() && lt.resultsAfter[k].empty();
    };
    for (int k = 0; k < seg.kernels_size();) {
      int end = k;
      while (end < seg.kernels_size() && groupable(end))
        ++end;
      if (end - k >= 2)
        resolved[k].groupEnd = end;
      k = std::max(end, k + 1);
    }
  }
  scratch.assign(std::max(1, plan.streams_size()), CallScratch{});
  return Status::ok();
}

Status ExecutorImpl::prepareKernels() {
  // Each stream prepares the kernels it will run, on its own worker (a
  // CUDA stream's cuDNN handle and scratch are its own), all streams at
  // once; a segment called by two streams is prepared on both.
  int numStreams = plan.streams_size();
  std::vector<Status> prepared(numStreams, Status::ok());
  for (int s = 0; s < numStreams; ++s) {
    std::vector<char> calls(plan.segments_size(), 0);
    for (const Instruction &inst : plan.streams(s).instructions())
      if (inst.kind() == Instruction::CALL && inst.segment() >= 0 &&
          inst.segment() < plan.segments_size())
        calls[inst.segment()] = 1;
    streams[s]->enqueue([this, s, calls = std::move(calls), &prepared] {
      KernelContext ctx;
      ctx.tensorMember = plan::tensorMember(plan, replica);
      ctx.contextMember = plan::contextMember(plan, replica);
      for (int g = 0; g < plan.segments_size(); ++g) {
        if (!calls[g])
          continue;
        const plan::Segment &seg = plan.segments(g);
        for (int k = 0; k < seg.kernels_size(); ++k) {
          const ResolvedKernel &rk = kernels[g][k];
          ctx.lowPrecision = rk.lowPrecision;
          Status st = device->prepareKernel(*rk.info, seg.kernels(k), rk.attrs,
                                            rk.inputs, rk.outputs, ctx);
          if (!st) {
            prepared[s] =
                st.withContext("stream '" + plan.streams(s).name() +
                               "', segment '" + seg.name() + "', kernel " +
                               std::to_string(k) + ": preparing its calls");
            return;
          }
        }
      }
    });
  }
  Status first = Status::ok();
  for (int s = 0; s < numStreams; ++s) {
    Status synced = streams[s]->synchronize();
    if (!synced && first)
      first = synced.withContext("preparing the kernels of stream '" +
                                 plan.streams(s).name() + "'");
    if (!prepared[s] && first)
      first = prepared[s];
  }
  return first;
}

Status ExecutorImpl::computeParam(int s, int p, StepState &st, void *&out) {
  const int64_t step = st.step;
  // The fifth state tensor of the parameter (Parameter.state_offsets[4]).
  out = bf16Params[p]->data;
  int64_t &seen = bf16Seen[s][p];
  if (seen == step)
    return Status::ok();
  hal::Event *ready = bf16Ready.empty() ? nullptr : bf16Ready[p].get();
  bool refreshed = false;
  {
    std::lock_guard<std::mutex> lock(bf16Mu);
    if (bf16Step[p] != step) {
      Status done = refreshParam(p);
      // Signalled before the step is published: a stream that finds this
      // step's copy finds the event signalled too.
      if (done && ready)
        done = ready->signal(static_cast<uint64_t>(step));
      if (!done)
        return done.withContext("the bf16 copy of parameter '" +
                                plan.params(p).name() + "'");
      bf16Step[p] = step;
      refreshed = true;
    }
  }
  // Refreshed by another stream, or written by the last step's update:
  // on a GPU that work is queued on its stream, so this stream is ordered
  // after it (the event), as after any value another stream writes.
  if (!refreshed && ready)
    PIPER_RETURN_IF_ERROR(
        ready->wait(static_cast<uint64_t>(step), st.failed)
            .withContext("waiting for the bf16 copy of parameter '" +
                         plan.params(p).name() + "'"));
  seen = step;
  return Status::ok();
}

Status ExecutorImpl::copyWritten(int p, int64_t step) {
  std::lock_guard<std::mutex> lock(bf16Mu);
  // Ordered before the next step's readers by the end of this step; the
  // event is signalled only because a stream that finds a copy it did not
  // refresh waits for its step's signal (computeParam).
  if (!bf16Ready.empty() && bf16Ready[p])
    PIPER_RETURN_IF_ERROR(
        bf16Ready[p]->signal(static_cast<uint64_t>(step + 1)));
  bf16Step[p] = step + 1;
  return Status::ok();
}

void ExecutorImpl::invalidateCopies() {
  // The next step refreshes copies that a capture would not.
  dropStepGraphs();
  std::lock_guard<std::mutex> lock(bf16Mu);
  std::fill(bf16Step.begin(), bf16Step.end(), 0);
  for (std::vector<int64_t> &seen : bf16Seen)
    std::fill(seen.begin(), seen.end(), 0);
}

Status ExecutorImpl::refreshParam(int p) {
  // A copy of the master, rounded (or packed): queued on the calling
  // stream.
  const TensorPtr &copy = bf16Params[p];
  const TensorPtr &master = stateOf(p, Operand::PARAM);
  if (packedParam[p])
    return device->packBf16(static_cast<uint16_t *>(copy->data),
                            static_cast<const float *>(master->data),
                            master->bytes / 4);
  PIPER_RETURN_IF_ERROR(memory->copy(copy->data, master->data,
                                     static_cast<size_t>(master->bytes)));
  return device->roundBf16(static_cast<float *>(copy->data), copy->bytes / 4);
}

namespace {

/// Sets `ref` to `view` (reusing ref's shape storage) over `data`.
inline void bind(TensorRef &ref, const TensorRef &view, void *data) {
  ref.dtype = view.dtype;
  ref.shape.assign(view.shape.begin(), view.shape.end());
  ref.data = data;
}

} // namespace

Status ExecutorImpl::call(int s, const Instruction &inst, StepState &st,
                          int64_t &accounted) {
  const int segIndex = inst.segment();
  const plan::Segment &seg = plan.segments(segIndex);
  const SegmentLifetimes &lt = lifetimes[segIndex];
  const std::vector<ResolvedKernel> &resolved = kernels[segIndex];
  CallScratch &scratch = this->scratch[s];
  // Every value lives in the arena: in the call's scratch at
  // scratch_offset + value_offsets[v], or (value_offsets[v] == -1) in the
  // step buffer it is bound to. Packed bf16 arguments are unpacked into
  // their scratch slot just before their first reader, and packed results
  // computed there are packed into their step buffer right after their
  // last writer: the memory plan gives each slot from its first kernel to
  // its last only.
  std::vector<void *> &values = scratch.values;
  values.assign(seg.values_size(), nullptr);
  char *base = at(inst.scratch_offset());
  for (int v = 0; v < seg.values_size(); ++v)
    if (seg.value_offsets(v) >= 0)
      values[v] = base + seg.value_offsets(v);
  for (int r = 0; r < inst.outputs_size(); ++r) {
    int v = seg.results(r);
    if (!values[v])
      values[v] = bufferViews[inst.outputs(r)]->data;
  }
  std::vector<TensorPtr> &packed = scratch.packed;
  packed.assign(inst.inputs_size(), nullptr);
  std::vector<void *> &packedValues = scratch.packedValues;
  packedValues.assign(seg.values_size(), nullptr);
  std::vector<char> &stored = scratch.stored;
  stored.assign(inst.outputs_size(), 0);
  // Values their writer stores packed: a result straight into its step
  // buffer (where that is packed), any other value in its slot.
  const PackedStorage &packing = packedStorage[segIndex];
  for (int r = 0; r < inst.outputs_size(); ++r) {
    const TensorPtr &dst = bufferViews[inst.outputs(r)];
    if (packing.packsResult[r] && dst->dtype == plan::BF16) {
      packedValues[seg.results(r)] = dst->data;
      stored[r] = 1;
    }
  }
  for (int v : packing.packedSlots)
    packedValues[v] = values[v];
  const std::vector<char> &unpacks = packing.unpacksArg;
  for (int a = 0; a < inst.inputs_size(); ++a) {
    int id = inst.inputs(a), v = seg.args(a);
    TensorPtr stored;
    PIPER_RETURN_IF_ERROR(fetchStored(st, id, stored));
    if (stored->dtype == plan::BF16 && seg.value_offsets(v) >= 0) {
      packedValues[v] = stored->data;
      if (unpacks[a])
        packed[a] = std::move(stored);
    } else {
      values[v] = stored->data; // arguments are never written
    }
  }

  KernelContext ctx;
  ctx.lossAccumulator = lossSums->slot(s);
  ctx.step = st.step;
  ctx.lrScale = scheduleScale(plan.training(), st.step);
  ctx.tensorMember = plan::tensorMember(plan, replica);
  ctx.contextMember = plan::contextMember(plan, replica);
  ctx.clipFactor = clips ? squares->factor() : nullptr;
  auto dataOf = [&](const Operand &op) -> void * {
    return op.kind() == Operand::VALUE ? values[op.index()]
                                       : stateOf(op.index(), op.kind())->data;
  };
  // Built only for an error message: most kernels take microseconds.
  auto where = [&](int k) {
    return "segment '" + seg.name() + "', kernel " + std::to_string(k);
  };
  // Kernel k's operands: bf16 copies for low-precision kernels' parameters,
  // this rank's ranges for a ZeRO-sharded update.
  auto bindOperands = [&](int k, std::vector<TensorRef> &ins,
                          std::vector<TensorRef> &outs) -> Status {
    const plan::Kernel &kernel = seg.kernels(k);
    const ResolvedKernel &rk = resolved[k];
    ins.resize(rk.inputs.size());
    outs.resize(rk.outputs.size());
    for (int j = 0; j < kernel.inputs_size(); ++j) {
      const Operand &op = kernel.inputs(j);
      if (rk.lowPrecision && op.kind() == Operand::PARAM) {
        void *copy = nullptr;
        PIPER_RETURN_IF_ERROR(
            computeParam(s, op.index(), st, copy).withContext(where(k)));
        bind(ins[j], rk.inputs[j], copy);
        if (packedParam[op.index()])
          ins[j].dtype = plan::BF16; // read as stored (planPackedParams)
      } else if (rk.packedInputs[j] && packedValues[op.index()]) {
        // A packed argument, as it is stored (Device::readsPackedInput).
        bind(ins[j], rk.inputs[j], packedValues[op.index()]);
        ins[j].dtype = plan::BF16;
      } else {
        bind(ins[j], rk.inputs[j], dataOf(op));
      }
    }
    for (int j = 0; j < kernel.outputs_size(); ++j) {
      const Operand &op = kernel.outputs(j);
      if (rk.packedOutputs[j] && packedValues[op.index()]) {
        // A value stored packed (PackedStorage).
        bind(outs[j], rk.outputs[j], packedValues[op.index()]);
        outs[j].dtype = plan::BF16;
      } else {
        bind(outs[j], rk.outputs[j], dataOf(op));
      }
    }
    if (rk.onRange) {
      for (int j = 0; j < kernel.inputs_size(); ++j)
        ins[j].data =
            rangeOf(kernel.inputs(j).index(), kernel.inputs(j).kind());
      for (int j = 0; j < kernel.outputs_size(); ++j)
        outs[j].data =
            rangeOf(kernel.outputs(j).index(), kernel.outputs(j).kind());
    }
    return Status::ok();
  };
  // The bf16 copy an update writes: fp32 storage, or packed.
  auto setCopy = [&](const ResolvedKernel &rk, float *&copy,
                     uint16_t *&packed) {
    copy = nullptr;
    packed = nullptr;
    if (rk.writesCopyOf < 0)
      return;
    void *data = bf16Params[rk.writesCopyOf]->data;
    if (packedParam[rk.writesCopyOf])
      packed = static_cast<uint16_t *>(data);
    else
      copy = static_cast<float *>(data);
  };
  const bool profiling = options.profile;
  std::vector<TensorRef> &ins = scratch.inputs, &outs = scratch.outputs;
  for (int k = 0; k < seg.kernels_size(); ++k) {
    const plan::Kernel &kernel = seg.kernels(k);
    const ResolvedKernel &rk = resolved[k];
    if (rk.groupEnd > 0) {
      // A run of `adamw` updates (no value operands): the backend may fuse
      // them into fewer launches (Device::runAdamwCalls).
      std::vector<AdamwCall> &calls = scratch.adamwCalls;
      calls.resize(static_cast<size_t>(rk.groupEnd - k));
      std::vector<hal::SquaresSpan> &spans = scratch.spans;
      spans.clear();
      for (int g = k; g < rk.groupEnd; ++g) {
        AdamwCall &c = calls[static_cast<size_t>(g - k)];
        c.kernel = &seg.kernels(g);
        c.attrs = &resolved[g].attrs;
        setCopy(resolved[g], c.bf16Copy, c.bf16PackedCopy);
        PIPER_RETURN_IF_ERROR(bindOperands(g, c.inputs, c.outputs));
        if (!c.inputs.empty())
          spans.push_back({c.inputs[0].f32(), c.inputs[0].numel(),
                           c.kernel->inputs(0).index()});
      }
      // Without CLIP_GRADS: each final gradient, before its update.
      if (!clips)
        PIPER_RETURN_IF_ERROR(squares->measure(spans).withContext(
            where(k) + ": the gradients' sums of squares"));
      Clock::time_point start;
      if (profiling)
        start = Clock::now();
      ctx.lowPrecision = false;
      size_t failed = 0;
      Status status = device->runAdamwCalls(*rk.info, calls, ctx, failed);
      if (profiling) {
        // Counted per call, the time shared among them.
        const int64_t ns = nanosSince(start), n = rk.groupEnd - k;
        for (int64_t g = 0; g < n; ++g)
          profiler.add(s, rk.profileRow,
                       g + 1 < n ? ns / n : ns - (n - 1) * (ns / n));
        accounted += ns;
      }
      if (!status)
        return status.withContext(
            where(k + static_cast<int>(std::min(failed, calls.size() - 1))));
      for (int g = k; g < rk.groupEnd; ++g)
        if (resolved[g].writesCopyOf >= 0)
          PIPER_RETURN_IF_ERROR(copyWritten(resolved[g].writesCopyOf, st.step)
                                    .withContext(where(g)));
      k = rk.groupEnd - 1;
      continue;
    }
    Clock::time_point start;
    if (profiling && !lt.allocBefore[k].empty())
      start = Clock::now();
    for (int a : lt.argsBefore[k]) {
      if (!packed[a])
        continue;
      int v = seg.args(a);
      PIPER_RETURN_IF_ERROR(
          device
              ->unpackBf16(static_cast<float *>(values[v]),
                           static_cast<const uint16_t *>(packed[a]->data),
                           packed[a]->bytes / 2)
              .withContext(where(k) + ": unpacking " +
                           describeBuffer(inst.inputs(a))));
      packed[a] = nullptr;
    }
    // A value starts zeroed at its first kernel, as a fresh tensor did.
    for (int v : lt.allocBefore[k]) {
      const plan::TensorType &type = seg.values(v);
      int64_t bytes = tensorBytes(type);
      PIPER_RETURN_IF_ERROR(
          memory->zero(values[v], static_cast<size_t>(bytes))
              .withContext(where(k) + ": zeroing value " + std::to_string(v)));
    }
    if (profiling && !lt.allocBefore[k].empty()) {
      int64_t ns = nanosSince(start);
      profiler.add(s, Profiler::kCallAlloc, ns);
      accounted += ns;
    }
    PIPER_RETURN_IF_ERROR(bindOperands(k, ins, outs));
    // Without CLIP_GRADS, the norm is taken of the final gradient just
    // before the update reads (and a later `zero` clears) it.
    if (!clips && rk.adamw && !ins.empty())
      PIPER_RETURN_IF_ERROR(
          squares
              ->measure(
                  {{ins[0].f32(), ins[0].numel(), kernel.inputs(0).index()}})
              .withContext(where(k) + ": the gradient's sum of squares"));
    if (profiling)
      start = Clock::now();
    ctx.lowPrecision = rk.lowPrecision;
    setCopy(rk, ctx.bf16Copy, ctx.bf16PackedCopy);
    Status status =
        device->runKernel(*rk.info, kernel, rk.attrs, ins, outs, ctx);
    if (status && rk.writesCopyOf >= 0)
      status = copyWritten(rk.writesCopyOf, st.step);
    if (profiling) {
      int64_t ns = nanosSince(start);
      profiler.add(s, rk.profileRow, ns);
      accounted += ns;
    }
    if (!status)
      return status.withContext(where(k));
    // bf16 activations and activation gradients; scalar losses stay fp32.
    if (rk.lowPrecision && !rk.roundsOutputs)
      for (size_t o = 0; o < outs.size(); ++o)
        if (kernel.outputs(int(o)).kind() == Operand::VALUE &&
            outs[o].dtype == plan::F32 && !outs[o].shape.empty())
          PIPER_RETURN_IF_ERROR(
              device->roundBf16(outs[o].f32(), outs[o].numel())
                  .withContext(where(k) + ": rounding output " +
                               std::to_string(o) + " to bf16"));
    for (int r : lt.resultsAfter[k]) {
      if (stored[r])
        continue; // written packed by the kernel
      bool done = false;
      PIPER_RETURN_IF_ERROR(packResult(inst, seg, values, r, done));
      stored[r] = done;
    }
  }
  return storeResults(inst, seg, values, stored, st);
}

Status ExecutorImpl::packResult(const Instruction &inst,
                                const plan::Segment &seg,
                                const std::vector<void *> &values, int r,
                                bool &packed) {
  int id = inst.outputs(r), v = seg.results(r);
  const TensorPtr &dst = bufferViews[id];
  packed = values[v] != dst->data && dst->dtype == plan::BF16 &&
           seg.value_offsets(v) >= 0;
  if (!packed)
    return Status::ok();
  return device
      ->packBf16(static_cast<uint16_t *>(dst->data),
                 static_cast<const float *>(values[v]), dst->bytes / 2)
      .withContext("segment '" + seg.name() + "': packing " +
                   describeBuffer(id));
}

Status ExecutorImpl::storeResults(const Instruction &inst,
                                  const plan::Segment &seg,
                                  const std::vector<void *> &values,
                                  const std::vector<char> &stored,
                                  StepState &st) {
  // Results go to their step buffers: packed from scratch in mixed
  // precision (after their last writer, unless an argument is returned),
  // copied when the value lives elsewhere (an argument, or a value that is
  // several results).
  for (int r = 0; r < inst.outputs_size(); ++r) {
    int id = inst.outputs(r);
    const TensorPtr &dst = bufferViews[id];
    int v = seg.results(r);
    const void *src = values[v];
    bool packed = stored[r];
    if (!packed)
      PIPER_RETURN_IF_ERROR(packResult(inst, seg, values, r, packed));
    if (packed || src == dst->data) {
      // Packed, or computed in place.
    } else {
      // An argument (in bf16, one passed through untouched: still packed)
      // or a value already stored for another result.
      PIPER_RETURN_IF_ERROR(
          memory->copy(dst->data, src, static_cast<size_t>(dst->bytes))
              .withContext("segment '" + seg.name() + "': storing " +
                           describeBuffer(id)));
    }
    PIPER_RETURN_IF_ERROR(publish(st, id));
  }
  return Status::ok();
}

} // namespace piper::runtime
