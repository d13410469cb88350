// The Gloo communicator's collectives: all-reduce, reduce-scatter,
// all-gather(v) and all-to-all(v), each run on its group's worker thread.
#include "runtime/comm/GlooCommunicator.h"

#include <gloo/allgatherv.h>
#include <gloo/allreduce.h>
#include <gloo/alltoallv.h>
#include <gloo/math.h>

#include <cstring>

#include "support/Precision.h"

namespace piper::runtime::gloo_comm {

CommWorkPtr GlooCommunicator::launch(Group &group, const std::string &op,
                                     std::function<Status(Group &)> body) {
  auto work = std::make_shared<AsyncWork>();
  group.enqueue([this, &group, op, body = std::move(body), work] {
    std::string failure = group.failureText();
    if (!failure.empty()) {
      work->complete(unusable(op, group, failure));
      return;
    }
    try {
      work->complete(body(group));
    } catch (const std::exception &e) {
      work->complete(fail(group, op, e));
    }
  });
  return work;
}

Status GlooCommunicator::runAllReduce(Group &group, const std::string &op,
                                      void *data, size_t count,
                                      size_t elementSize, ReduceFn reduce) {
  if (!group.context || count == 0)
    return Status::ok();
  try {
    gloo::AllreduceOptions opts(group.context);
    if (elementSize == sizeof(double))
      opts.setOutput(static_cast<double *>(data), count);
    else
      opts.setOutput(static_cast<float *>(data), count);
    opts.setReduceFunction(reduce);
    opts.setTag(group.nextTag++);
    opts.setTimeout(timeout);
    gloo::allreduce(opts);
  } catch (const std::exception &e) {
    return fail(group, op, e);
  }
  return Status::ok();
}

namespace {

/// Adds `n` elements of `src` (f32 or bf16) to the fp32 `acc`.
void accumulate(float *acc, const void *src, size_t n, CommDType type) {
  if (type == CommDType::F32) {
    const float *s = static_cast<const float *>(src);
    for (size_t i = 0; i < n; ++i)
      acc[i] += s[i];
  } else {
    const uint16_t *s = static_cast<const uint16_t *>(src);
    for (size_t i = 0; i < n; ++i)
      acc[i] += bf16ToFloat(s[i]);
  }
}

bool reducible(CommDType type) {
  return type == CommDType::F32 || type == CommDType::BF16;
}

/// A pointer Gloo accepts for an empty buffer.
void *nonNull(const void *p) {
  static char dummy;
  return p ? const_cast<void *>(p) : &dummy;
}

std::vector<int64_t> byteCounts(const std::vector<size_t> &counts,
                                size_t elementSize) {
  std::vector<int64_t> bytes;
  for (size_t c : counts)
    bytes.push_back(static_cast<int64_t>(c * elementSize));
  return bytes;
}

} // namespace

CommWorkPtr GlooCommunicator::allReduce(const CommKey &key, void *data,
                                        size_t count, CommDType type) {
  std::string op = fmt::format("all-reduce over ranks {} on stream '{}'",
                               rankList(key.ranks), key.stream);
  Group *group = nullptr;
  Status status = collectiveGroup(key, op, nullptr, group);
  if (!status)
    return completedWork(status);
  if (!reducible(type))
    return completedWork(
        opError(op, fmt::format("cannot sum {}", commDTypeName(type))));
  if (!group->context || count == 0)
    return completedWork();
  return launch(*group, op, [=](Group &g) {
    if (type == CommDType::F32)
      return runAllReduce(g, op, data, count, sizeof(float),
                          static_cast<ReduceFn>(&gloo::sum<float>));
    // bf16: widened to fp32, summed in fp32, rounded once.
    std::vector<float> wide(count);
    uint16_t *bits = static_cast<uint16_t *>(data);
    for (size_t i = 0; i < count; ++i)
      wide[i] = bf16ToFloat(bits[i]);
    PIPER_RETURN_IF_ERROR(
        runAllReduce(g, op, wide.data(), count, sizeof(float),
                     static_cast<ReduceFn>(&gloo::sum<float>)));
    for (size_t i = 0; i < count; ++i)
      bits[i] = floatToBf16(wide[i]);
    return Status::ok();
  });
}

CommWorkPtr GlooCommunicator::reduceScatter(const CommKey &key,
                                            const void *input, void *output,
                                            const std::vector<size_t> &counts,
                                            CommDType type) {
  std::string op = fmt::format("reduce-scatter over ranks {} on stream '{}'",
                               rankList(key.ranks), key.stream);
  Group *group = nullptr;
  Status status = collectiveGroup(key, op, &counts, group);
  if (!status)
    return completedWork(status);
  if (!reducible(type))
    return completedWork(
        opError(op, fmt::format("cannot sum {}", commDTypeName(type))));
  size_t es = commDTypeSize(type);
  int me = group->contextRank(myRank);
  size_t mine = counts[me];
  if (!group->context) {
    std::memcpy(output, input, mine * es);
    return completedWork();
  }
  // Every member's slice goes to its owner (an all-to-all), which sums the
  // slices it receives in rank order in fp32.
  return launch(*group, op, [=](Group &g) {
    size_t n = g.key.ranks.size();
    std::vector<char> slices(n * mine * es + 1);
    gloo::AlltoallvOptions opts(g.context);
    opts.setInput(static_cast<uint8_t *>(nonNull(input)),
                  byteCounts(counts, es));
    opts.setOutput(reinterpret_cast<uint8_t *>(slices.data()),
                   byteCounts(std::vector<size_t>(n, mine), es));
    opts.setTag(g.nextTag++);
    opts.setTimeout(timeout);
    gloo::alltoallv(opts);
    std::vector<float> sum(mine, 0.0f);
    for (size_t r = 0; r < n; ++r)
      accumulate(sum.data(), slices.data() + r * mine * es, mine, type);
    if (type == CommDType::F32) {
      std::memcpy(output, sum.data(), mine * es);
    } else {
      uint16_t *bits = static_cast<uint16_t *>(output);
      for (size_t i = 0; i < mine; ++i)
        bits[i] = floatToBf16(sum[i]);
    }
    return Status::ok();
  });
}

CommWorkPtr GlooCommunicator::allGather(const CommKey &key, const void *input,
                                        void *output,
                                        const std::vector<size_t> &counts,
                                        CommDType type) {
  std::string op = fmt::format("all-gather over ranks {} on stream '{}'",
                               rankList(key.ranks), key.stream);
  Group *group = nullptr;
  Status status = collectiveGroup(key, op, &counts, group);
  if (!status)
    return completedWork(status);
  size_t es = commDTypeSize(type);
  int me = group->contextRank(myRank);
  if (!group->context) {
    std::memcpy(output, input, counts[me] * es);
    return completedWork();
  }
  return launch(*group, op, [=](Group &g) {
    std::vector<size_t> bytes;
    for (size_t c : counts)
      bytes.push_back(c * es);
    gloo::AllgathervOptions opts(g.context);
    opts.setInput(static_cast<uint8_t *>(nonNull(input)), counts[me] * es);
    opts.setOutput(static_cast<uint8_t *>(nonNull(output)), bytes);
    opts.setTag(g.nextTag++);
    opts.setTimeout(timeout);
    gloo::allgatherv(opts);
    return Status::ok();
  });
}

CommWorkPtr GlooCommunicator::allToAll(const CommKey &key, const void *input,
                                       const std::vector<size_t> &sendCounts,
                                       void *output,
                                       const std::vector<size_t> &recvCounts,
                                       CommDType type) {
  std::string op = fmt::format("all-to-all over ranks {} on stream '{}'",
                               rankList(key.ranks), key.stream);
  Group *group = nullptr;
  Status status = collectiveGroup(key, op, &sendCounts, group);
  if (status)
    status = collectiveGroup(key, op, &recvCounts, group);
  if (!status)
    return completedWork(status);
  size_t es = commDTypeSize(type);
  int me = group->contextRank(myRank);
  if (!group->context) {
    if (sendCounts[me] != recvCounts[me])
      return completedWork(
          opError(op, fmt::format("sends {} elements to itself but receives {}",
                                  sendCounts[me], recvCounts[me])));
    std::memcpy(output, input, sendCounts[me] * es);
    return completedWork();
  }
  return launch(*group, op, [=](Group &g) {
    gloo::AlltoallvOptions opts(g.context);
    opts.setInput(static_cast<uint8_t *>(nonNull(input)),
                  byteCounts(sendCounts, es));
    opts.setOutput(static_cast<uint8_t *>(nonNull(output)),
                   byteCounts(recvCounts, es));
    opts.setTag(g.nextTag++);
    opts.setTimeout(timeout);
    gloo::alltoallv(opts);
    return Status::ok();
  });
}

} // namespace piper::runtime::gloo_comm
