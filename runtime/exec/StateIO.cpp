// Parameter state in and out of the executor: raw parameter files
// (--save-params), safetensors checkpoints of parameters, gradients or AdamW
// moments, and loading them back, each through host staging copies.
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include <sys/stat.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "runtime/exec/ExecutorImpl.h"
#include "runtime/formats/Integrity.h"
#include "support/Errno.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "--save-params writes the host's floats as little endian");

namespace piper::runtime {

using plan::Operand;

const std::string &Executor::runId() const { return impl->options.runId; }

void Executor::setRunId(const std::string &runId) {
  impl->options.runId = runId;
}

TensorRef Executor::state(int index, plan::Operand::Kind kind) const {
  if (index < 0 || index >= impl->plan.params_size() || kind < Operand::PARAM ||
      kind > Operand::ADAM_V)
    return TensorRef{};
  return impl->stateOf(index, kind)->ref();
}

Status Executor::stateToHost(int index, plan::Operand::Kind kind,
                             std::vector<float> &out) const {
  TensorRef t = state(index, kind);
  out.resize(static_cast<size_t>(t.data ? t.numel() : 0));
  if (out.empty())
    return Status::ok();
  return impl->memory->copyToHost(out.data(), t.data, 4 * out.size())
      .withContext(impl->who + ": reading the state of parameter " +
                   std::to_string(index));
}

Status Executor::saveParams(const std::string &dir) const {
  // mkdir -p: create each component, tolerating the ones that exist.
  for (size_t pos = 1; pos <= dir.size(); ++pos) {
    if (pos != dir.size() && dir[pos] != '/')
      continue;
    std::string prefix = dir.substr(0, pos);
    if (::mkdir(prefix.c_str(), 0755) != 0 && errno != EEXIST)
      return Status::error(impl->who + ": cannot create directory '" + prefix +
                           "': " + errnoMessage(errno));
  }
  for (int p = 0; p < impl->plan.params_size(); ++p) {
    const std::string &name = impl->plan.params(p).name();
    std::string path = dir + "/" + name + ".bin";
    // A tied parameter has a copy in several classes, whose first replicas
    // all save it: each writes its own temporary file, and the renames
    // (of identical bytes) replace one another atomically.
    std::string tmp = path + ".tmp." + std::to_string(impl->options.rank);
    std::vector<char> host;
    PIPER_RETURN_IF_ERROR(wholeState(p, Operand::PARAM, host));
    if (impl->replica != 0)
      continue; // a ZeRO-3 member that contributed its shard
    FILE *f = std::fopen(tmp.c_str(), "wb");
    if (!f)
      return Status::error(impl->who + ": cannot write '" + tmp +
                           "': " + errnoMessage(errno));
    size_t n = std::fwrite(host.data(), 1, host.size(), f);
    bool ok = n == host.size();
    ok = (std::fclose(f) == 0) && ok;
    if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
      std::remove(tmp.c_str());
      return Status::error(impl->who + ": cannot write '" + path + "'");
    }
  }
  return Status::ok();
}

std::vector<ParamSpec> Executor::paramSpecs() const {
  // Checkpoints hold global tensors, whatever a rank keeps of them.
  std::vector<ParamSpec> specs;
  for (const plan::Parameter &p : impl->plan.params())
    specs.push_back(ParamSpec{p.name(), plan::globalShape(p)});
  return specs;
}

std::vector<ParamSpec> Executor::heldParamSpecs() const {
  std::vector<ParamSpec> specs;
  for (const plan::Parameter &p : impl->plan.params())
    specs.push_back(ParamSpec{
        p.name(), {p.type().shape().begin(), p.type().shape().end()}});
  return specs;
}

namespace {

/// The checkpoint name of parameter `name`'s piece of state `kind`: the
/// parameter's own name (its value or gradient), or the names of PyTorch
/// AdamW's state for its moments.
std::string stateName(const std::string &name, int kind) {
  if (kind == Operand::ADAM_M)
    return name + ".exp_avg";
  if (kind == Operand::ADAM_V)
    return name + ".exp_avg_sq";
  return name;
}

} // namespace

Status Executor::saveCheckpoint(const std::string &path, int64_t step) const {
  return saveState(path, step, {Operand::PARAM});
}

Status Executor::saveGradients(const std::string &path, int64_t step) const {
  return saveState(path, step, {Operand::GRAD});
}

Status Executor::saveOptimizerState(const std::string &path,
                                    int64_t step) const {
  return saveState(path, step, {Operand::ADAM_M, Operand::ADAM_V});
}

bool Executor::shardsState() const {
  for (const plan::Parameter &p : impl->plan.params())
    if (p.has_sharding() || plan::sliceMembers(p) >= 2)
      return true;
  return false;
}

namespace {

/// Whether piece `kind` of a ZeRO parameter is valid only in each member's
/// range: a sharded piece, or the gradient (a ZeRO-1 accumulator is whole,
/// but the reduce-scatter leaves each member only its range of the sum).
bool heldAsRanges(const plan::Parameter &param, int kind) {
  return param.has_sharding() &&
         (kind == Operand::GRAD || plan::stateSharded(param, kind - 1));
}

} // namespace

Status Executor::wholeState(int p, int kind, std::vector<char> &out) const {
  const plan::Plan &plan = impl->plan;
  const plan::Parameter &param = plan.params(p);
  const bool writer = impl->replica == 0;
  const bool sliced = plan::sliceMembers(param) >= 2;
  if (!sliced && !heldAsRanges(param, kind)) {
    if (writer) {
      const TensorPtr &t = impl->stateOf(p, kind);
      out.resize(static_cast<size_t>(t->bytes));
      PIPER_RETURN_IF_ERROR(
          impl->memory->copyToHost(out.data(), t->data, out.size())
              .withContext(impl->who + ": reading " +
                           stateName(param.name(), kind)));
    }
    return Status::ok();
  }
  // Each member of a group holds a slice of the global tensor (an expert
  // block, or a tensor-parallel slice: runs of elements), and under ZeRO
  // each data replica a range of its member's tensor. Replica 0 (member 0
  // of the first group) gets the whole tensor (checkpoints hold whole
  // tensors, so any strategy can load them): first the ranges are gathered
  // into the member's tensor over its shard group, then the members'
  // tensors over the slice group.
  const int64_t n = plan::paramElements(param);
  auto gather = [&](const std::vector<int> &ranks, const float *mine,
                    const std::vector<size_t> &counts, float *all,
                    const char *what) -> Status {
    if (ranks.size() < 2) {
      std::memcpy(all, mine, 4 * counts[0]);
      return Status::ok();
    }
    return impl->comm
        ->allGather(CommKey{kStateStream, ranks}, mine, all, counts,
                    CommDType::F32)
        ->wait()
        .withContext(impl->who + ": gathering the " + what + " of " +
                     stateName(param.name(), kind));
  };
  std::vector<float> local(static_cast<size_t>(n));
  if (heldAsRanges(param, kind)) {
    std::vector<int> ranks = plan::shardGroup(plan, param, impl->replica);
    std::vector<size_t> counts;
    for (size_t m = 0; m < ranks.size(); ++m)
      counts.push_back(static_cast<size_t>(
          plan::shardRange(n, static_cast<int64_t>(ranks.size()), m).count));
    std::vector<float> mine(static_cast<size_t>(impl->shard[p].count));
    PIPER_RETURN_IF_ERROR(
        impl->memory
            ->copyToHost(mine.data(), impl->rangeOf(p, kind), 4 * mine.size())
            .withContext(impl->who + ": reading " +
                         stateName(param.name(), kind)));
    PIPER_RETURN_IF_ERROR(
        gather(ranks, mine.data(), counts, local.data(), "ZeRO shards"));
  } else {
    PIPER_RETURN_IF_ERROR(impl->memory
                              ->copyToHost(local.data(),
                                           impl->stateOf(p, kind)->data,
                                           4 * local.size())
                              .withContext(impl->who + ": reading " +
                                           stateName(param.name(), kind)));
  }
  std::vector<char> whole;
  if (!sliced) {
    whole.resize(4 * local.size());
    std::memcpy(whole.data(), local.data(), whole.size());
  } else {
    std::vector<int> ranks = plan::sliceGroup(plan, param, impl->replica);
    whole.resize(static_cast<size_t>(4 * n) * ranks.size());
    PIPER_RETURN_IF_ERROR(
        gather(ranks, local.data(),
               std::vector<size_t>(ranks.size(), static_cast<size_t>(n)),
               reinterpret_cast<float *>(whole.data()), "slices"));
    if (writer && plan::tensorSliceMembers(param) >= 2) {
      // The members' tensors, in member order, into their runs.
      std::vector<char> global(whole.size());
      for (size_t m = 0; m < ranks.size(); ++m)
        for (const plan::SliceRun &run : plan::sliceRuns(param, m))
          std::memcpy(global.data() + 4 * run.global,
                      whole.data() + 4 * (m * n + run.local),
                      static_cast<size_t>(4 * run.count));
      whole = std::move(global);
    }
  }
  if (writer)
    out = std::move(whole);
  return Status::ok();
}

Status Executor::saveState(const std::string &path, int64_t step,
                           const std::vector<int> &kinds) const {
  const plan::Plan &plan = impl->plan;
  std::vector<SafetensorsTensor> tensors;
  std::vector<std::vector<char>> host;
  host.reserve(plan.params_size() * kinds.size());
  for (int p = 0; p < plan.params_size(); ++p) {
    const plan::Parameter &param = plan.params(p);
    for (int kind : kinds) {
      host.emplace_back();
      PIPER_RETURN_IF_ERROR(wholeState(p, kind, host.back()));
      tensors.push_back(SafetensorsTensor{stateName(param.name(), kind), "F32",
                                          plan::globalShape(param),
                                          host.back().data()});
    }
  }
  if (impl->replica != 0)
    return Status::ok();
  SafetensorsMetadata meta = checkpointMetadata(step, impl->options.runId);
  addCrc32s(meta, tensors);
  return writeSafetensors(path, tensors, meta).withContext(impl->who);
}

Status Executor::loadCheckpoint(const SafetensorsReader &reader) {
  return loadState(reader, Operand::PARAM);
}

Status Executor::loadOptimizerState(const SafetensorsReader &reader) {
  PIPER_RETURN_IF_ERROR(loadState(reader, Operand::ADAM_M));
  return loadState(reader, Operand::ADAM_V);
}

namespace {
/// Reads tensor `name` of `reader` into `host`: `bytes` of them, which
/// checkCheckpointParams has already checked (a mismatch is internal).
Status readCheckedTensor(const SafetensorsReader &reader,
                         const std::string &name, int64_t bytes,
                         const std::string &who, std::vector<char> &host) {
  const SafetensorsEntry *e = reader.find(name);
  if (!e || static_cast<int64_t>(e->end - e->begin) != bytes)
    return Status::error(who + ": internal: checkpoint tensor '" + name +
                         "' has a bad size");
  host.resize(static_cast<size_t>(bytes));
  return reader.read(*e, host.data()).withContext(who);
}
} // namespace

Status Executor::loadState(const SafetensorsReader &reader, int kind) {
  impl->invalidateCopies();
  std::vector<ParamSpec> specs = paramSpecs();
  for (ParamSpec &spec : specs)
    spec.name = stateName(spec.name, kind);
  PIPER_RETURN_IF_ERROR(
      checkCheckpointParams(reader, specs, /*rejectExtra=*/false)
          .withContext(impl->who));
  for (int p = 0; p < impl->plan.params_size(); ++p) {
    const plan::Parameter &param = impl->plan.params(p);
    std::vector<char> host;
    PIPER_RETURN_IF_ERROR(readCheckedTensor(reader, specs[p].name,
                                            4 * plan::paramElements(param) *
                                                plan::sliceMembers(param),
                                            impl->who, host));
    // This member's slice of the global tensor (all of it when whole), or
    // under ZeRO this replica's range of that.
    const bool ranged = plan::stateSharded(param, kind - 1);
    const int64_t start = ranged ? impl->shard[p].start : 0,
                  count = ranged ? impl->shard[p].count
                                 : plan::paramElements(param);
    std::vector<char> mine(static_cast<size_t>(4 * count));
    for (const plan::SliceRun &run : plan::rangeRuns(
             param, plan::sliceMember(impl->plan, param, impl->replica), start,
             count))
      std::memcpy(mine.data() + 4 * run.local, host.data() + 4 * run.global,
                  static_cast<size_t>(4 * run.count));
    PIPER_RETURN_IF_ERROR(
        impl->memory
            ->copyFromHost(ranged ? impl->rangeOf(p, kind)
                                  : impl->stateOf(p, kind)->data,
                           mine.data(), mine.size())
            .withContext(impl->who + ": loading " + specs[p].name));
  }
  return Status::ok();
}

Status Executor::loadHeldState(const SafetensorsReader &model,
                               const SafetensorsReader &optimizer) {
  impl->invalidateCopies();
  const std::vector<ParamSpec> held = heldParamSpecs();
  for (int kind : {Operand::PARAM, Operand::ADAM_M, Operand::ADAM_V}) {
    const SafetensorsReader &reader =
        kind == Operand::PARAM ? model : optimizer;
    std::vector<ParamSpec> specs = held;
    for (ParamSpec &spec : specs)
      spec.name = stateName(spec.name, kind);
    PIPER_RETURN_IF_ERROR(
        checkCheckpointParams(reader, specs, /*rejectExtra=*/false)
            .withContext(impl->who));
    for (int p = 0; p < impl->plan.params_size(); ++p) {
      const plan::Parameter &param = impl->plan.params(p);
      if (param.has_sharding())
        return Status::error(impl->who + ": internal: '" + param.name() +
                             "' is held as ZeRO ranges, not whole");
      std::vector<char> host;
      PIPER_RETURN_IF_ERROR(readCheckedTensor(reader, specs[p].name,
                                              4 * plan::paramElements(param),
                                              impl->who, host));
      PIPER_RETURN_IF_ERROR(
          impl->memory
              ->copyFromHost(impl->stateOf(p, kind)->data, host.data(),
                             host.size())
              .withContext(impl->who + ": loading " + specs[p].name));
    }
  }
  return Status::ok();
}

} // namespace piper::runtime

namespace piper::runtime {

Status Executor::saveShards(const std::string &path, int64_t step) const {
  const plan::Plan &plan = impl->plan;
  const int replica = impl->replica;
  std::vector<SafetensorsTensor> tensors;
  std::vector<std::vector<char>> host;
  std::string slices = "{";
  host.reserve(plan.params_size() * 3);
  for (int p = 0; p < plan.params_size(); ++p) {
    const plan::Parameter &param = plan.params(p);
    for (int kind : {Operand::PARAM, Operand::ADAM_M, Operand::ADAM_V}) {
      int64_t start = 0, count = plan::paramElements(param);
      const void *data = impl->stateOf(p, kind)->data;
      // A tensor-parallel slice is runs of the global tensor: described by
      // the slice, which the reader turns into the runs (plan::sliceRuns).
      std::string tensorSlice;
      const int64_t member = plan::sliceMember(plan, param, replica);
      if (plan::tensorSliceMembers(param) >= 2) {
        const plan::TensorSlice &ts = param.tensor_slice();
        tensorSlice = fmt::format(
            "\"dim\": {}, \"members\": {}, \"member\": {}, \"parts\": [{}]",
            ts.dim(), ts.members(), member, fmt::join(ts.parts(), ", "));
      }
      if (heldAsRanges(param, kind)) {
        // A ZeRO range: every replica's own (of its member's slice, under
        // tensor parallelism: "start" in the slice's description).
        start = impl->shard[p].start;
        count = impl->shard[p].count;
        data = impl->rangeOf(p, kind);
        if (!tensorSlice.empty())
          tensorSlice += fmt::format(", \"start\": {}", start);
      } else if (plan::sliceMembers(param) >= 2) {
        // The group of replica 0 writes every block or slice.
        std::vector<int> first = plan::sliceGroup(plan, param, 0);
        if (std::find(first.begin(), first.end(), impl->options.rank) ==
            first.end())
          continue;
        if (plan::tensorSliceMembers(param) < 2)
          start = member * count;
      } else if (replica != 0) {
        continue;
      }
      if (count == 0)
        continue;
      host.emplace_back(static_cast<size_t>(4 * count));
      std::string name = stateName(param.name(), kind);
      PIPER_RETURN_IF_ERROR(
          impl->memory->copyToHost(host.back().data(), data, host.back().size())
              .withContext(impl->who + ": reading " + name));
      tensors.push_back(
          SafetensorsTensor{name, "F32", {count}, host.back().data()});
      slices += (slices.size() > 1 ? ", \"" : "\"") + name + "\": ";
      if (tensorSlice.empty())
        slices += fmt::format("[{}, {}]", start,
                              fmt::join(plan::globalShape(param), ", "));
      else
        slices +=
            fmt::format("{{\"global\": [{}], {}}}",
                        fmt::join(plan::globalShape(param), ", "), tensorSlice);
    }
  }
  if (tensors.empty())
    return Status::ok();
  SafetensorsMetadata meta = checkpointMetadata(step, impl->options.runId);
  meta.emplace_back("piper.slices", slices + "}");
  addCrc32s(meta, tensors);
  return writeSafetensors(path, tensors, meta).withContext(impl->who);
}

Status Executor::loadShards(const StateSource &source, bool moments) {
  impl->invalidateCopies();
  const plan::Plan &plan = impl->plan;
  const std::vector<int> kinds =
      moments
          ? std::vector<int>{Operand::PARAM, Operand::ADAM_M, Operand::ADAM_V}
          : std::vector<int>{Operand::PARAM};
  for (int p = 0; p < plan.params_size(); ++p) {
    const plan::Parameter &param = plan.params(p);
    for (int kind : kinds) {
      int64_t start = 0, count = plan::paramElements(param);
      float *dst = static_cast<float *>(impl->stateOf(p, kind)->data);
      if (plan::stateSharded(param, kind - 1)) {
        start = impl->shard[p].start;
        count = impl->shard[p].count;
        dst = impl->rangeOf(p, kind);
      } else if (plan::expertMembers(param) >= 2) {
        start = plan::sliceMember(plan, param, impl->replica) * count;
      }
      std::vector<float> host(static_cast<size_t>(count));
      if (plan::tensorSliceMembers(param) >= 2) {
        // The runs of this member's slice (or of this replica's ZeRO range
        // of it), from the whole tensor: one read.
        int64_t n =
            plan::paramElements(param) * plan::tensorSliceMembers(param);
        std::vector<float> whole(static_cast<size_t>(n));
        PIPER_RETURN_IF_ERROR(
            source.read(stateName(param.name(), kind), 0, n, whole.data())
                .withContext(impl->who));
        for (const plan::SliceRun &run : plan::rangeRuns(
                 param, plan::sliceMember(plan, param, impl->replica),
                 plan::stateSharded(param, kind - 1) ? start : 0, count))
          std::copy_n(whole.begin() + run.global, run.count,
                      host.begin() + run.local);
      } else {
        PIPER_RETURN_IF_ERROR(
            source
                .read(stateName(param.name(), kind), start, count, host.data())
                .withContext(impl->who));
      }
      PIPER_RETURN_IF_ERROR(
          impl->memory->copyFromHost(dst, host.data(), 4 * host.size())
              .withContext(impl->who + ": loading " +
                           stateName(param.name(), kind)));
    }
  }
  return Status::ok();
}

} // namespace piper::runtime
