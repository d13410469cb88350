// The --checkpoint-dir lock: flock() on a file that records its holder.
#include "runtime/launch/checkpoints/CheckpointLock.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <sstream>

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <fmt/format.h>

#include "support/AtomicFile.h"
#include "support/Errno.h"

namespace piper::runtime {

namespace {

std::string thisHost() {
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0)
    return "?";
  return name;
}

/// The holder's record, as acquire() writes it: "pid P\nhost H\njob J\n
/// since T\n".
struct Holder {
  long long pid = -1;
  std::string host, job, since;
};

Holder readHolder(int fd) {
  std::string text(4096, '\0');
  ssize_t got = ::pread(fd, text.data(), text.size(), 0);
  text.resize(got > 0 ? size_t(got) : 0);
  Holder h;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    size_t space = line.find(' ');
    if (space == std::string::npos)
      continue;
    std::string key = line.substr(0, space), value = line.substr(space + 1);
    if (key == "pid")
      h.pid = std::atoll(value.c_str());
    else if (key == "host")
      h.host = value;
    else if (key == "job")
      h.job = value;
    else if (key == "since")
      h.since = value;
  }
  return h;
}

std::string describe(const Holder &h) {
  if (h.pid < 0)
    return "another process (it has not recorded itself yet)";
  return fmt::format("job '{}' (pid {} on host '{}', since {})", h.job, h.pid,
                     h.host, h.since);
}

} // namespace

Status CheckpointDirLock::acquire(const std::string &dir,
                                  const std::string &job,
                                  std::unique_ptr<CheckpointDirLock> &out) {
  out.reset();
  std::string what = fmt::format("--checkpoint-dir '{}'", dir);
  PIPER_RETURN_IF_ERROR(makeDirectories(dir).withContext(what));
  std::string path = fmt::format("{}/{}", dir, kCheckpointLockFile);
  // O_CLOEXEC: ranks and spares the launcher starts do not hold it, so a
  // rank that outlives its launcher cannot keep it.
  int fd =
      ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd < 0)
    return Status::error(fmt::format("{}: cannot open its lock '{}': {}", what,
                                     path, errnoMessage(errno)));
  int rc;
  while ((rc = ::flock(fd, LOCK_EX | LOCK_NB)) != 0 && errno == EINTR) {
  }
  if (rc != 0) {
    int err = errno;
    if (err != EWOULDBLOCK) {
      ::close(fd);
      // Some network file systems have no locks: run, but say so.
      std::fprintf(stderr,
                   "piper-run: warning: %s: cannot lock '%s' (%s); nothing "
                   "keeps another job out of this directory\n",
                   what.c_str(), path.c_str(), errnoMessage(err).c_str());
      return Status::ok();
    }
    Holder holder = readHolder(fd);
    ::close(fd);
    // The local launcher holds it for the ranks it starts.
    if (holder.pid == ::getppid() && holder.host == thisHost())
      return Status::ok();
    return Status::error(fmt::format(
        "{} is in use by another job: {} holds its lock '{}' (two jobs "
        "writing one checkpoint directory remove each other's checkpoints: "
        "wait for that job to end, or give this one another --checkpoint-dir)",
        what, describe(holder), path));
  }
  char since[64] = "?";
  std::time_t now = std::time(nullptr);
  std::tm utc;
  if (::gmtime_r(&now, &utc))
    std::strftime(since, sizeof(since), "%Y-%m-%d %H:%M:%S UTC", &utc);
  std::string record = fmt::format("pid {}\nhost {}\njob {}\nsince {}\n",
                                   ::getpid(), thisHost(), job, since);
  // Informative only: the lock is the flock, whatever the record says.
  if (::ftruncate(fd, 0) != 0 ||
      ::pwrite(fd, record.data(), record.size(), 0) != ssize_t(record.size()))
    std::fprintf(stderr,
                 "piper-run: warning: %s: cannot record this job in "
                 "'%s'\n",
                 what.c_str(), path.c_str());
  out.reset(new CheckpointDirLock(fd));
  return Status::ok();
}

CheckpointDirLock::~CheckpointDirLock() {
  if (fd >= 0)
    ::close(fd);
}

} // namespace piper::runtime
