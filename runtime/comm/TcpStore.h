// A TCP key-value store for rendezvous without a shared file system, as
// PyTorch's TCPStore: rank 0 serves it at MASTER_ADDR:MASTER_PORT, every
// rank (rank 0 too) is a client. A job id keeps two jobs apart.
#ifndef PIPER_RUNTIME_COMM_TCPSTORE_H
#define PIPER_RUNTIME_COMM_TCPSTORE_H

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <gloo/rendezvous/store.h>

#include "runtime/comm/Communicator.h"
#include "support/Status.h"

namespace piper::runtime {

/// What the store's server accepts (docs/operations.md, "Job isolation").
/// Nothing is allocated for a connection beyond a fixed record until its
/// hello, at most `maxHello` bytes, names the store's job. Connections that
/// have said hello are the job's ranks, at most the world size; those that
/// have not have a budget of their own, so strangers on the port (idle
/// sockets, half-hellos, a slowloris) can delay a rank by no more than one
/// turn of the server's loop.
struct TcpStoreLimits {
  /// Connections that have not said hello yet. When that many are open (or
  /// the process is out of descriptors), a new one closes the oldest of
  /// them, which is told "busy" (its client tries again until its timeout).
  /// The server lowers it to what RLIMIT_NOFILE leaves room for.
  int maxPending = 1024;
  /// A connection that has not said hello within this is closed; the bytes
  /// of a hello that trickles in do not extend it.
  std::chrono::milliseconds helloTimeout{5000};
  /// The largest hello (job id, rank and world size).
  uint32_t maxHello = 4096;
  /// The largest request of a rank that has joined (a key and its value).
  uint32_t maxMessage = 64u << 20;
};

/// The server side: one thread serving every connection from a poll loop.
/// A client must first say hello with the job's id, its rank and the world
/// size; another job's id, another world size or a rank that has already
/// joined is refused with a message the client reports, and the connection
/// closed. Refused and finished connections release their descriptor and
/// memory at once.
class TcpStoreServer {
public:
  /// Where the server reports refused connections (rate-limited); may be
  /// empty.
  using Log = std::function<void(const std::string &)>;

  /// Listens on `host`:`port` (an address of this machine; never all
  /// interfaces) for the `worldSize` ranks of the job `jobId`.
  static std::unique_ptr<TcpStoreServer>
  start(const std::string &host, int port, const std::string &jobId,
        int worldSize, Status &status, const TcpStoreLimits &limits = {},
        Log log = nullptr);
  ~TcpStoreServer();
  TcpStoreServer(const TcpStoreServer &) = delete;
  TcpStoreServer &operator=(const TcpStoreServer &) = delete;

  /// The port it listens on (the one asked for, or the one the system
  /// chose for port 0).
  int port() const { return boundPort; }
  /// Connections open now, and refused so far (for tests and reports).
  size_t openConnections() const { return openCount.load(); }
  size_t refusedConnections() const { return refusedCount.load(); }

private:
  struct Connection;
  TcpStoreServer() = default;
  void loop();
  void acceptSome(std::chrono::steady_clock::time_point &acceptAgainAt);
  /// Closes the connection that has waited longest for its hello, telling
  /// it the store is busy; false when every open one has said hello.
  /// `cursor` is where the search starts (connections before it have said
  /// hello or are closed) and is moved past the one closed.
  bool evictOldest(size_t &cursor, const std::string &why);
  void readSome(Connection &c);
  void flush(Connection &c);
  void close(Connection &c);
  /// Answers one complete request of `c`.
  void handle(Connection &c, const std::string &request);
  void hello(Connection &c, const std::string &request);
  /// Counts a refused connection and reports it, at most a few lines.
  void refused(const std::string &what);

  std::string jobId;
  int worldSize = 0;
  TcpStoreLimits limits;
  Log log;
  int listenFd = -1;
  int wakeFds[2] = {-1, -1};
  int boundPort = 0;
  std::thread server;
  // Touched by the server thread alone once it runs.
  std::vector<std::unique_ptr<Connection>> connections;
  size_t pending = 0;
  /// limits.maxPending, lowered to what RLIMIT_NOFILE leaves room for.
  size_t pendingCap = 0;
  std::map<std::string, std::string> data;
  std::vector<bool> joined;
  size_t logged = 0, unlogged = 0;
  std::chrono::steady_clock::time_point nextLog{};
  std::atomic<size_t> openCount{0}, refusedCount{0};
};

/// The client side, usable as a Gloo rendezvous store (whose errors are
/// exceptions) and directly (Status). Thread-safe. A call that fails (no
/// answer within the timeout, a closed connection) loses the store for good.
class TcpStore final : public gloo::rendezvous::Store {
public:
  /// Connects to the store at `host`:`port` as `rank` of `worldSize` of
  /// the job `jobId`, retrying until `timeout` (rank 0 may not listen yet,
  /// or be busy).
  static std::shared_ptr<TcpStore>
  connect(const std::string &host, int port, const std::string &jobId, int rank,
          int worldSize, std::chrono::milliseconds timeout, Status &status);
  ~TcpStore() override;

  // gloo::rendezvous::Store; errors throw gloo::IoException.
  void set(const std::string &key, const std::vector<char> &value) override;
  std::vector<char> get(const std::string &key) override;
  void wait(const std::vector<std::string> &keys) override;
  void wait(const std::vector<std::string> &keys,
            const std::chrono::milliseconds &timeout) override;

  Status setValue(const std::string &key, const std::string &value);
  /// Whether `key` is set now, without waiting.
  Status has(const std::string &key, bool &present);
  /// Reads `key` without waiting: `present` says whether it is set.
  Status getValue(const std::string &key, std::string &value, bool &present);
  /// Waits until every key of `keys` is set or `timeout` passes; then
  /// `missing` lists those still unset (empty on success).
  Status waitFor(const std::vector<std::string> &keys,
                 std::chrono::milliseconds timeout,
                 std::vector<std::string> &missing);

  /// "host:port", for messages.
  const std::string &address() const { return where; }

private:
  TcpStore() = default;
  /// Sends `request`, reads the reply into `reply`.
  Status call(const std::string &request, std::string &reply);

  std::string where;
  std::chrono::milliseconds timeout{0};
  int fd = -1;
  std::mutex mu;
  /// Set by the first call that failed: its reply may still arrive and would
  /// be read as the next call's, so the connection is not used again, and
  /// every later call fails at once with this error (the watchdog then
  /// names the store's rank within --timeout-s, not one timeout per call).
  std::string lost;
};

/// Creates a Gloo communicator over TCP whose pairs bind to `hostname`,
/// meeting the other ranks through `store` (a TcpStore, or any Gloo store).
/// Otherwise as the file-store createGlooCommunicator of Communicator.h.
std::unique_ptr<Communicator>
createGlooCommunicator(int rank, int worldSize,
                       std::shared_ptr<gloo::rendezvous::Store> store,
                       std::chrono::milliseconds timeout, Status &status,
                       const std::string &hostname);

} // namespace piper::runtime

#endif // PIPER_RUNTIME_COMM_TCPSTORE_H
