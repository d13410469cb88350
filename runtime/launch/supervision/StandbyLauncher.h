// Hot spares (--standby), the local launcher's side: starting the spares,
// promoting one to a failed rank's place, and choosing the state the next
// generation of ranks starts from (docs/operations.md, "Hot spares").
#ifndef PIPER_RUNTIME_LAUNCH_SUPERVISION_STANDBYLAUNCHER_H
#define PIPER_RUNTIME_LAUNCH_SUPERVISION_STANDBYLAUNCHER_H

#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <sys/types.h>

#include "proto/plan.pb.h"
#include "runtime/launch/options/RunOptions.h"
#include "support/Status.h"

namespace piper::runtime {

/// Why no replica can give a lost rank's state under `plans`: the first
/// device class that shards its state over its replicas (ZeRO: a rank's
/// shard has no copy); empty when every class's replicas hold whole state.
std::string shardedStateNote(const std::vector<plan::Plan> &plans);

/// Before any rank starts: with --standby, a device class held by one rank
/// (a pipeline stage without data parallelism), a tensor-parallel member
/// held by one rank (tensor parallelism without data parallelism) or a
/// class sharding its state over its replicas (ZeRO) has no replica to copy
/// a lost state from, so --checkpoint-dir must be given. `plans` are the
/// manifest's, in class order.
Status checkStandbyState(const RunOptions &options,
                         const plan::Manifest &manifest,
                         const std::vector<plan::Plan> &plans);

/// The parked spares of a run.
class Spares {
public:
  ~Spares();
  /// Starts options.standby spares: this executable with `argv`, `baseEnv`
  /// plus their protocol variables (the failure pipe's write end
  /// `failureFd`); with --log-dir each writes DIR/standby-<i>.log.
  Status start(const RunOptions &options, char **argv,
               const std::vector<std::string> &baseEnv, int failureFd);
  /// Spares parked and alive / promoted so far / started.
  int left() const { return static_cast<int>(parked.size()); }
  int used() const { return promoted; }
  int total() const { return started; }
  /// Promotes the first parked spare: sends it `vars(its index)`
  /// (NAME=value, the environment of the rank it becomes). Returns its pid
  /// and sets `index`, or -1 when none could take it (each that could not
  /// is dropped, with a line).
  pid_t promote(const std::function<std::vector<std::string>(int index)> &vars,
                int &index);
  /// Reaps, without blocking, spares that died while parked, with a line
  /// each.
  void reapExited();
  /// The end of the run: closes the promotion pipes (a parked spare then
  /// exits 0), and stops those that do not.
  void release();

private:
  struct Spare {
    int index = 0;
    pid_t pid = -1;
    int fd = -1; // write end of its promotion pipe
  };
  std::vector<Spare> parked;
  int promoted = 0;
  int started = 0;
};

/// Where the next generation's state comes from.
struct Recovery {
  /// Every device class (every tensor-parallel member of it) has a
  /// surviving rank that handed off its state at `step`; `dir` holds
  /// recoveryStateName(C, M) links to them.
  bool fromReplicas = false;
  int64_t step = 0;
  std::string dir;
  /// Per rank of the manifest: the rank whose state it gets.
  std::map<int, int> sourceOf;
  /// Why not, when !fromReplicas.
  std::string why;
};

/// Looks at the states the ranks of the generation that failed handed off
/// under `handoffDir` (rank-<R>/step-<S>/), leaving out the ranks of `lost`,
/// and picks the newest step every device class has one of; links them
/// into `recoveryDir`/recoveryStateName(C, M). Under tensor parallelism
/// (`tensorParallel`: plan::tensorParallel of each class, 1 where absent)
/// the replicas of a class hold T different states, one per member
/// (replica r is member r mod T): each is looked for among the replicas of
/// its member.
Status planRecovery(const plan::Manifest &manifest,
                    const std::vector<int64_t> &tensorParallel,
                    const std::string &handoffDir, const std::set<int> &lost,
                    const std::string &recoveryDir, Recovery &out);

/// The device class of `rank` in `manifest`, or -1.
int deviceClassOf(const plan::Manifest &manifest, int rank);

} // namespace piper::runtime

#endif // PIPER_RUNTIME_LAUNCH_SUPERVISION_STANDBYLAUNCHER_H
