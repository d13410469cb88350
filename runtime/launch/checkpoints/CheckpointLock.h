// One job at a time in a --checkpoint-dir: an exclusive lock on a file in
// it, held for the job's life (docs/operations.md, "The checkpoint
// directory's lock").
#ifndef PIPER_RUNTIME_LAUNCH_CHECKPOINTS_CHECKPOINTLOCK_H
#define PIPER_RUNTIME_LAUNCH_CHECKPOINTS_CHECKPOINTLOCK_H

#include <memory>
#include <string>

#include "support/Status.h"

namespace piper::runtime {

/// The lock file's name inside the checkpoint directory.
constexpr const char *kCheckpointLockFile = ".piper-run.lock";

/// An exclusive flock() on DIR/.piper-run.lock, which records its holder
/// (pid, host, job, since when). Released when the object goes or the
/// process ends, however it ends; a child process never inherits it.
class CheckpointDirLock {
public:
  /// Takes the lock of `dir` (created if needed) for the job `job`. When
  /// another process holds it: ok with `out` null if that process is this
  /// one's parent on this host (the local launcher holds it for its ranks,
  /// restarts and spares), else an error naming the directory and the
  /// holder. A file system without locks is a warning on stderr, not an
  /// error (`out` null).
  static Status acquire(const std::string &dir, const std::string &job,
                        std::unique_ptr<CheckpointDirLock> &out);
  ~CheckpointDirLock();
  CheckpointDirLock(const CheckpointDirLock &) = delete;
  CheckpointDirLock &operator=(const CheckpointDirLock &) = delete;

private:
  explicit CheckpointDirLock(int fd) : fd(fd) {}
  int fd;
};

} // namespace piper::runtime

#endif // PIPER_RUNTIME_LAUNCH_CHECKPOINTS_CHECKPOINTLOCK_H
