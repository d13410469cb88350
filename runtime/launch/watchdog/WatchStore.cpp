// The stores the watchdog keeps heartbeats and the verdict in: piper-run's
// local rendezvous folder, or the TCP store rank 0 serves.
#include <cerrno>
#include <fstream>
#include <sstream>

#include <fcntl.h>
#include <unistd.h>

#include <fmt/format.h>

#include "runtime/launch/watchdog/Watchdog.h"
#include "support/AtomicFile.h"
#include "support/Errno.h"

namespace piper::runtime {

namespace {

class FileWatchStore final : public WatchStore {
public:
  explicit FileWatchStore(std::string dir) : dir(std::move(dir)) {}

  Status put(const std::string &key, const std::string &value) override {
    std::string tmp;
    PIPER_RETURN_IF_ERROR(writeTemp(key, value, tmp));
    if (::rename(tmp.c_str(), path(key).c_str()) != 0) {
      Status st = Status::error(fmt::format("cannot rename '{}': {}", tmp,
                                            errnoMessage(errno)));
      ::unlink(tmp.c_str());
      return st;
    }
    return Status::ok();
  }

  Status putOnce(const std::string &key, const std::string &value,
                 bool &wrote) override {
    std::string tmp;
    PIPER_RETURN_IF_ERROR(writeTemp(key, value, tmp));
    wrote = ::link(tmp.c_str(), path(key).c_str()) == 0;
    int err = errno;
    ::unlink(tmp.c_str());
    if (!wrote && err != EEXIST)
      return Status::error(fmt::format("cannot create '{}': {}", path(key),
                                       errnoMessage(err)));
    return Status::ok();
  }

  Status get(const std::string &key, std::string &value,
             bool &present) override {
    std::ifstream in(path(key), std::ios::binary);
    present = static_cast<bool>(in);
    value.clear();
    if (present) {
      std::stringstream ss;
      ss << in.rdbuf();
      value = ss.str();
    }
    return Status::ok();
  }

private:
  std::string path(const std::string &key) const { return dir + "/" + key; }
  Status writeTemp(const std::string &key, const std::string &value,
                   std::string &tmp) {
    tmp = fmt::format("{}/.{}.{}.tmp", dir, key, ::getpid());
    int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC,
                    0644);
    if (fd < 0)
      return Status::error(
          fmt::format("cannot create '{}': {}", tmp, errnoMessage(errno)));
    bool ok = ::write(fd, value.data(), value.size()) ==
              static_cast<ssize_t>(value.size());
    int err = errno;
    ::close(fd);
    if (!ok) {
      ::unlink(tmp.c_str());
      return Status::error(
          fmt::format("cannot write '{}': {}", tmp, errnoMessage(err)));
    }
    return Status::ok();
  }
  std::string dir;
};

class TcpWatchStore final : public WatchStore {
public:
  explicit TcpWatchStore(std::shared_ptr<TcpStore> store)
      : store(std::move(store)) {}
  Status put(const std::string &key, const std::string &value) override {
    return store->setValue(key, value);
  }
  Status putOnce(const std::string &key, const std::string &value,
                 bool &wrote) override {
    // Not atomic across ranks: two verdicts within one round trip may both
    // be written; the last stands, and every rank re-reads it.
    bool present = false;
    PIPER_RETURN_IF_ERROR(store->has(key, present));
    wrote = !present;
    return present ? Status::ok() : store->setValue(key, value);
  }
  Status get(const std::string &key, std::string &value,
             bool &present) override {
    return store->getValue(key, value, present);
  }

private:
  std::shared_ptr<TcpStore> store;
};

} // namespace

std::unique_ptr<WatchStore> fileWatchStore(const std::string &dir) {
  return std::make_unique<FileWatchStore>(dir);
}

std::unique_ptr<WatchStore> tcpWatchStore(std::shared_ptr<TcpStore> store) {
  return std::make_unique<TcpWatchStore>(std::move(store));
}

} // namespace piper::runtime
