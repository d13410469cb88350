// Strategy validation across ranks: the manifest's classes against their
// plans, every SEND matched by a RECV, and identical collective sequences on
// every member of a group.
#include <algorithm>
#include <map>
#include <tuple>

#include "proto/PlanGroups.h"
#include "runtime/exec/Validate.h"
#include "runtime/exec/ValidateInternal.h"

namespace piper::runtime {

using plan::Instruction;
using namespace validate;

namespace {

/// A point-to-point message: (from, to, stream name, tag).
using Key = std::tuple<int, int, std::string, int>;
/// One end of a message: its bytes and where the instruction is.
struct End {
  int64_t bytes;
  int rank, stream, inst;
};
/// Collectives: (stream name, sorted ranks) -> per member, the signature
/// (kinds and element counts) of its sequence of collectives.
using CollectiveSequences = std::map<std::pair<std::string, std::vector<int>>,
                                     std::map<int, std::vector<int64_t>>>;

/// The cross-rank checks of one manifest and its plans, in the order
/// validateStrategy runs them.
class StrategyChecker {
public:
  StrategyChecker(const plan::Manifest &manifest,
                  const std::vector<plan::Plan> &plans)
      : manifest(manifest), plans(plans), world(manifest.world_size()) {}

  /// Checks the world size and the plan count, then places every world
  /// rank on exactly one manifest class whose plan matches it.
  Status placeRanks();
  /// Gathers every rank's SENDs, RECVs and group collectives; fails on a
  /// tag reused between the same ranks on the same stream.
  Status collectTraffic();
  /// Every SEND is matched by a RECV of the same size, and every RECV by a
  /// SEND.
  Status checkPointToPoint() const;
  /// Every member of a group issues the same sequence of collectives over
  /// it on each stream.
  Status checkCollectives() const;

private:
  /// The collective signature entries of `inst` on rank `r`, appended to
  /// that rank's sequence for its subgroup and stream.
  Status collectCollective(int r, const plan::Plan &plan,
                           const plan::Stream &stream, int s, int i);
  /// "rank R (class C), <instruction context>".
  std::string where(int rank, int s, int i) const;

  const plan::Manifest &manifest;
  const std::vector<plan::Plan> &plans;
  int world;
  // Where each world rank runs: (class position, replica index).
  std::vector<std::pair<int, int>> placeOf;
  std::map<Key, End> sends, recvs;
  CollectiveSequences collectives;
};

Status StrategyChecker::placeRanks() {
  if (world < 1)
    return Status::error("manifest world_size " + std::to_string(world) +
                         " must be at least 1");
  if (static_cast<int>(plans.size()) != manifest.classes_size())
    return Status::error(
        "internal: " + std::to_string(plans.size()) + " plans for " +
        std::to_string(manifest.classes_size()) + " manifest classes");

  placeOf.assign(world, {-1, -1});
  for (int c = 0; c < manifest.classes_size(); ++c) {
    const plan::Manifest::Class &cls = manifest.classes(c);
    const plan::Plan &plan = plans[c];
    std::string what = "device class " + std::to_string(cls.device_class());
    PIPER_RETURN_IF_ERROR(checkRankList(cls.ranks(), world, what));
    for (int i = 0; i < cls.ranks_size(); ++i) {
      int r = cls.ranks(i);
      if (placeOf[r].first >= 0)
        return Status::error("rank " + std::to_string(r) +
                             " is listed by two device classes");
      placeOf[r] = {c, i};
    }
    if (plan.device_class() != cls.device_class())
      return Status::error(what + ": its plan file '" + cls.plan_file() +
                           "' holds device class " +
                           std::to_string(plan.device_class()));
    if (plan.world_size() != world)
      return Status::error(what + ": its plan has world_size " +
                           std::to_string(plan.world_size()) +
                           ", the manifest " + std::to_string(world));
    if (!std::equal(plan.ranks().begin(), plan.ranks().end(),
                    cls.ranks().begin(), cls.ranks().end()))
      return Status::error(
          what + ": its plan runs on ranks " +
          ranksString({plan.ranks().begin(), plan.ranks().end()}) +
          ", the manifest lists " +
          ranksString({cls.ranks().begin(), cls.ranks().end()}));
  }
  for (int r = 0; r < world; ++r)
    if (placeOf[r].first < 0)
      return Status::error("rank " + std::to_string(r) +
                           " is in no device class of the manifest");
  return Status::ok();
}

std::string StrategyChecker::where(int rank, int s, int i) const {
  const plan::Plan &plan = plans[placeOf[rank].first];
  return "rank " + std::to_string(rank) + " (class " +
         std::to_string(plan.device_class()) + "), " +
         instructionContext(plan, s, i);
}

Status StrategyChecker::collectTraffic() {
  for (int r = 0; r < world; ++r) {
    const plan::Plan &plan = plans[placeOf[r].first];
    int replica = placeOf[r].second;
    for (int s = 0; s < plan.streams_size(); ++s) {
      const plan::Stream &stream = plan.streams(s);
      for (int i = 0; i < stream.instructions_size(); ++i) {
        const Instruction &inst = stream.instructions(i);
        if (inst.kind() == Instruction::SEND ||
            inst.kind() == Instruction::RECV) {
          bool isSend = inst.kind() == Instruction::SEND;
          int peer = plan.groups(inst.peer_group()).ranks(replica);
          int buf = isSend ? inst.inputs(0) : inst.outputs(0);
          Key key{isSend ? r : peer, isSend ? peer : r, stream.name(),
                  inst.tag()};
          auto &table = isSend ? sends : recvs;
          End end{tensorBytes(plan.buffers(buf).type()), r, s, i};
          auto [it, fresh] = table.emplace(key, end);
          if (!fresh)
            return Status::error(
                where(r, s, i) + ": tag " + std::to_string(inst.tag()) +
                " is already used by " +
                where(it->second.rank, it->second.stream, it->second.inst) +
                " between the same ranks on the same stream");
        } else if (plan::isGroupCollective(inst.kind())) {
          PIPER_RETURN_IF_ERROR(collectCollective(r, plan, stream, s, i));
        }
      }
    }
  }
  return Status::ok();
}

Status StrategyChecker::collectCollective(int r, const plan::Plan &plan,
                                          const plan::Stream &stream, int s,
                                          int i) {
  const Instruction &inst = stream.instructions(i);
  const plan::DeviceGroup *g = plan::memberGroup(plan, inst, r);
  if (!g)
    return Status::error(where(r, s, i) +
                         ": no subgroup of the collective contains "
                         "this rank");
  std::vector<int> ranks(g->ranks().begin(), g->ranks().end());
  std::sort(ranks.begin(), ranks.end());
  if (ranks.size() < 2)
    return Status::ok();
  // The signature members must agree on: the kind, then the element counts
  // (per row for ALL_TO_ALL, whose counts are decided at run time).
  std::vector<int64_t> &seq = collectives[{stream.name(), ranks}][r];
  seq.push_back(-static_cast<int64_t>(inst.kind()));
  for (int p : inst.params())
    seq.push_back(tensorBytes(plan.params(p).type()) / 4);
  for (int id : inst.inputs()) {
    const plan::TensorType &t = plan.buffers(id).type();
    int64_t n = tensorBytes(t) / 4;
    if (inst.kind() == Instruction::ALL_TO_ALL && t.shape_size() > 0)
      n /= std::max<int64_t>(1, t.shape(0));
    seq.push_back(n);
  }
  seq.insert(seq.end(), inst.counts().begin(), inst.counts().end());
  return Status::ok();
}

Status StrategyChecker::checkPointToPoint() const {
  for (auto &[key, s] : sends) {
    auto it = recvs.find(key);
    if (it == recvs.end())
      return Status::error(
          where(s.rank, s.stream, s.inst) + ": sends to rank " +
          std::to_string(std::get<1>(key)) + " with tag " +
          std::to_string(std::get<3>(key)) +
          ", but that rank has no RECV from rank " + std::to_string(s.rank) +
          " with this tag on a "
          "stream named '" +
          std::get<2>(key) + "'");
    if (it->second.bytes != s.bytes)
      return Status::error(
          where(s.rank, s.stream, s.inst) + ": sends " +
          std::to_string(s.bytes) + " bytes but " +
          where(it->second.rank, it->second.stream, it->second.inst) +
          " receives " + std::to_string(it->second.bytes));
  }
  for (auto &[key, r] : recvs)
    if (!sends.count(key))
      return Status::error(
          where(r.rank, r.stream, r.inst) + ": receives from rank " +
          std::to_string(std::get<0>(key)) + " with tag " +
          std::to_string(std::get<3>(key)) +
          ", but that rank has no SEND to rank " + std::to_string(r.rank) +
          " with this tag on a "
          "stream named '" +
          std::get<2>(key) + "'");
  return Status::ok();
}

Status StrategyChecker::checkCollectives() const {
  for (auto &[key, members] : collectives) {
    const std::vector<int> &ranks = key.second;
    const std::vector<int64_t> *first = nullptr;
    int firstRank = -1;
    for (int r : ranks) {
      auto it = members.find(r);
      if (it == members.end())
        return Status::error("rank " + std::to_string(r) +
                             " issues no collective over group " +
                             ranksString(ranks) + " on stream '" + key.first +
                             "', but other members do");
      if (!first) {
        first = &it->second;
        firstRank = r;
      } else if (it->second != *first) {
        return Status::error("ranks " + std::to_string(firstRank) + " and " +
                             std::to_string(r) +
                             " issue different collective sequences over "
                             "group " +
                             ranksString(ranks) + " on stream '" + key.first +
                             "' (" + std::to_string(first->size()) + " vs " +
                             std::to_string(it->second.size()) +
                             " entries: kinds and element counts differ)");
      }
    }
  }
  return Status::ok();
}

} // namespace

Status validateStrategy(const plan::Manifest &manifest,
                        const std::vector<plan::Plan> &plans) {
  StrategyChecker checker(manifest, plans);
  PIPER_RETURN_IF_ERROR(checker.placeRanks());
  PIPER_RETURN_IF_ERROR(checker.collectTraffic());
  PIPER_RETURN_IF_ERROR(checker.checkPointToPoint());
  return checker.checkCollectives();
}

} // namespace piper::runtime
