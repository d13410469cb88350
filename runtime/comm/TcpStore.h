// A TCP key-value store for rendezvous without a shared file system, as
// PyTorch's TCPStore: rank 0 serves it at MASTER_ADDR:MASTER_PORT, every
// rank (rank 0 too) is a client. A per-job token keeps two jobs apart.
#ifndef PIPER_RUNTIME_COMM_TCPSTORE_H
#define PIPER_RUNTIME_COMM_TCPSTORE_H

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <gloo/rendezvous/store.h>

#include "runtime/comm/Communicator.h"
#include "runtime/support/Status.h"

namespace piper::runtime {

/// The server side: one thread accepting clients and one per client. A
/// client must first say hello with the job's token, its rank and the world
/// size; a wrong token, another world size or a rank that has already
/// joined is refused with a message the client reports.
class TcpStoreServer {
public:
  /// Listens on `host`:`port` (an address of this machine; never all
  /// interfaces) for the `worldSize` ranks of the job `token`.
  static std::unique_ptr<TcpStoreServer> start(const std::string &host,
                                               int port,
                                               const std::string &token,
                                               int worldSize, Status &status);
  ~TcpStoreServer();
  TcpStoreServer(const TcpStoreServer &) = delete;
  TcpStoreServer &operator=(const TcpStoreServer &) = delete;

  /// The port it listens on (the one asked for, or the one the system
  /// chose for port 0).
  int port() const { return boundPort; }

private:
  TcpStoreServer() = default;
  void acceptLoop();
  void serve(int fd);
  std::string hello(const std::string &request, int fd);

  std::string token;
  int worldSize = 0;
  int listenFd = -1;
  int boundPort = 0;
  std::atomic<bool> stopping{false};
  std::thread acceptor;
  std::mutex mu; // guards everything below
  std::vector<std::pair<std::string, std::vector<char>>> data;
  std::vector<int> clientFds;
  std::vector<int> joinedRanks;
  std::vector<std::thread> clients;
};

/// The client side, usable as a Gloo rendezvous store (whose errors are
/// exceptions) and directly (Status). Thread-safe.
class TcpStore final : public gloo::rendezvous::Store {
public:
  /// Connects to the store at `host`:`port` as `rank` of `worldSize` of
  /// the job `token`, retrying until `timeout` (rank 0 may not listen yet).
  static std::shared_ptr<TcpStore>
  connect(const std::string &host, int port, const std::string &token, int rank,
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
