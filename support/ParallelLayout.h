// The one parallel layout of Piper's world: which rank holds which
// coordinate of each parallel axis, and which ranks form a group of an
// axis. The compiler (strategy flags, replicate, shard, the TP and CP
// lowerings, the #piper.mesh attribute) and the runtime (plan shards, the
// executor's member indices) both ask it; nothing else does the arithmetic.
// Free of MLIR and protobuf.
//
// The order, outermost first: pp, dp, cp, tp (Megatron's "tp-cp-ep-dp-pp"
// with tp innermost): rank = ((pp * dp + d) * cp + c) * tp + t. Tensor
// members are consecutive ranks; a context-parallel ring takes one rank of
// each tp-block; data replicas are whole cp x tp blocks; a pipeline stage
// group is a whole dp x cp x tp block.
//
// Two derived axes fold into that order without changing it:
//  - dpcp, the gradient replicas (dp x cp, Megatron's dp-cp group): ranks
//    with the same pp and tp coordinate. Gradient sums and ZeRO shards run
//    over it; its coordinate is rank / tp within the stage group.
//  - ep, expert parallelism ("parallel folding": TP on attention, EP on the
//    experts): ep consecutive gradient replicas of one tensor member, so an
//    ep group is a dpcp group cut into blocks of ep.
//  - edp, the expert data replicas (Megatron's expert-data-parallel group):
//    the ranks holding the same experts, one of each ep group of a dpcp
//    group; the gradients of expert weights are summed over it.
#ifndef PIPER_SUPPORT_PARALLELLAYOUT_H
#define PIPER_SUPPORT_PARALLELLAYOUT_H

#include <cstdint>
#include <string>
#include <vector>

namespace piper {

enum class Axis : uint8_t { pp, dp, cp, tp, ep, dpcp, edp };

/// "pp", "dp", "cp", "tp", "ep", "dp-cp", "edp".
const char *axisName(Axis axis);

/// The degree of each axis (1: the axis is not used).
struct Degrees {
  int64_t pp = 1, dp = 1, cp = 1, tp = 1, ep = 1;
  bool operator==(const Degrees &o) const {
    return pp == o.pp && dp == o.dp && cp == o.cp && tp == o.tp && ep == o.ep;
  }
};

/// A rank's coordinate on each axis of the order (ep and dpcp are derived).
struct Coords {
  int64_t pp = 0, dp = 0, cp = 0, tp = 0;
};

class ParallelLayout {
public:
  /// "" when `d` is a layout: every degree positive, ep dividing dp x cp,
  /// and the world (pp x dp x cp x tp) at most `maxWorld` ranks; otherwise
  /// why not, naming the degrees.
  static std::string check(const Degrees &d, int64_t maxWorld);

  /// A layout of checked degrees (degrees below 1 count as 1).
  explicit ParallelLayout(const Degrees &d = {});

  const Degrees &degrees() const { return d_; }
  /// Ranks of the world, and of one pipeline stage group (dp x cp x tp).
  int64_t worldSize() const { return d_.pp * stageSize(); }
  int64_t stageSize() const { return d_.dp * d_.cp * d_.tp; }

  /// The axis' degree (dpcp: dp x cp; edp: dp x cp / ep), and the distance
  /// between the ranks of consecutive members of one of its groups.
  int64_t size(Axis axis) const;
  int64_t stride(Axis axis) const;

  /// Which member of its `axis` group `rank` is.
  int64_t member(Axis axis, int64_t rank) const;
  Coords coords(int64_t rank) const;
  int64_t rank(const Coords &c) const;

  /// The ranks of `rank`'s `axis` group, member 0 first.
  std::vector<int64_t> group(Axis axis, int64_t rank) const;
  /// Every `axis` group of the world, by first rank.
  std::vector<std::vector<int64_t>> groups(Axis axis) const;
  /// The ranks whose `axis` coordinate is `member`, increasing (a pipeline
  /// stage group: slice(Axis::pp, g)).
  std::vector<int64_t> slice(Axis axis, int64_t member) const;

  /// "pp=2 dp=2 cp=1 tp=2 ep=1".
  std::string str() const;

private:
  Degrees d_;
};

} // namespace piper

#endif // PIPER_SUPPORT_PARALLELLAYOUT_H
