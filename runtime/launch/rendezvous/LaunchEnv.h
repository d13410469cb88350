// Where a rank stands when another program started it: piper-run's own
// spawner, torchrun-style variables, Slurm's srun or Open MPI's mpirun.
#ifndef PIPER_RUNTIME_LAUNCH_RENDEZVOUS_LAUNCHENV_H
#define PIPER_RUNTIME_LAUNCH_RENDEZVOUS_LAUNCHENV_H

#include <functional>
#include <string>
#include <vector>

#include "support/Status.h"

namespace piper::runtime {

/// Where one rank stands in a run (docs/operations.md).
struct RankEnv {
  int rank = 0;
  int worldSize = 1;
  /// The rank's index among the ranks of its machine.
  int localRank = 0;
  /// How many ranks share its machine, when the launcher says
  /// (LOCAL_WORLD_SIZE, SLURM_NTASKS_PER_NODE, OMPI_COMM_WORLD_LOCAL_SIZE);
  /// 0 when unknown.
  int localWorldSize = 0;
  /// Who started it: "piper-run", "torchrun", "slurm" or "openmpi".
  std::string launcher = "piper-run";
  /// The folder the Gloo file store of every rank shares (piper-run's own
  /// spawner); empty for one rank or when meeting over TCP.
  std::string storeDir;
  /// Otherwise the TCP store rank 0 serves here.
  std::string masterAddr;
  int masterPort = 0;
  /// The job's id, part of the id the rendezvous admits (jobName):
  /// PIPER_JOB_ID when set (piper-run's own spawner sets a random one),
  /// else the launcher's (TORCHELASTIC_RUN_ID; SLURM_JOB_ID.SLURM_STEP_ID;
  /// OMPI_MCA_ess_base_jobid, else PMIX_NAMESPACE); empty when there is
  /// none.
  std::string jobId;
};

/// The variables of the protocol between the launcher and its spares.
/// A spare: its index, and the read end of its promotion pipe.
inline constexpr const char *kStandbyVar = "PIPER_STANDBY";
inline constexpr const char *kStandbyFdVar = "PIPER_STANDBY_FD";
/// Where a rank hands its step-boundary state off when a peer fails:
/// DIR/rank-<R>/step-<S>/.
inline constexpr const char *kHandoffDirVar = "PIPER_HANDOFF_DIR";
/// Where a recovered rank finds its state: DIR/recoveryStateName(C, M)/
/// (model.safetensors, optimizer.safetensors).
inline constexpr const char *kRecoveryDirVar = "PIPER_RECOVERY_DIR";
/// The state of the ranks of device class `cls` that are tensor-parallel
/// member `member` (plan::tensorMember; 0 without tensor parallelism) in a
/// recovery folder: they hold the same slices, so one state serves them.
inline std::string recoveryStateName(int cls, int64_t member) {
  return "class-" + std::to_string(cls) + "-member-" + std::to_string(member);
}
/// What rank 0 says of the recovery when it trains again.
inline constexpr const char *kRecoveryNoteVar = "PIPER_RECOVERY_NOTE";
/// In a promotion only: resume from --checkpoint-dir (as --resume).
inline constexpr const char *kPromoteResumeVar = "PIPER_PROMOTE_RESUME";

/// The files of one handed-off step: DIR/step-<S>/ holds the model and
/// optimizer files of a checkpoint (kCheckpointModelFile, ...) and, written
/// last, this marker.
inline constexpr const char *kHandoffCompleteFile = "complete";

/// The exit code of a rank that ran to its end but could not write all of
/// its --log-dir log (a full disk): lines of it are missing.
constexpr int kExitLogLost = 5;

/// The longest job id (PIPER_JOB_ID or a launcher's); it travels in the
/// rendezvous store's hello, which is capped.
constexpr size_t kMaxJobIdSize = 256;

/// "<launcher>:<job id>", or the launcher alone when it has no job id: the
/// job as messages and the checkpoint directory's lock name it.
std::string jobName(const RankEnv &env);

/// Looks up an environment variable (null when unset); std::getenv by
/// default, a map in tests.
using EnvLookup = std::function<const char *(const char *)>;

/// Reads this process's rank from the environment, trying in order
/// piper-run's spawner (PIPER_RANK, PIPER_WORLD_SIZE, PIPER_STORE_DIR),
/// torchrun-style variables (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
/// MASTER_PORT), Slurm (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, the
/// first host of SLURM_JOB_NODELIST; only inside an srun step) and Open MPI
/// (OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK); then the job id (RankEnv). Sets
/// `isRank` false (and returns ok) when none applies, or when an external
/// launcher's world of one asks for `nproc` > 1 local ranks: the process is
/// then a launcher. `nproc` is --nproc (0 when absent), which must agree with
/// the world.
Status readRankEnv(int nproc, const EnvLookup &env, bool &isRank, RankEnv &out);
/// readRankEnv on this process's environment.
Status readRankEnv(int nproc, bool &isRank, RankEnv &out);

/// Expands a Slurm host list ("node[01-04,07],gpu3") into host names, in
/// order; an error for malformed lists or more than `limit` hosts.
Status expandNodeList(const std::string &list, std::vector<std::string> &hosts,
                      size_t limit = 100000);

/// The first host of a Slurm host list ("node[01-04,07]" -> "node01").
Status firstNodeListHost(const std::string &list, std::string &host);

} // namespace piper::runtime

#endif // PIPER_RUNTIME_LAUNCH_RENDEZVOUS_LAUNCHENV_H
