// Collective and point-to-point communication used by the executor. The Gloo
// implementation runs over TCP on CPUs; an NCCL one will follow for GPUs.
#ifndef PIPER_RUNTIME_COMM_COMMUNICATOR_H
#define PIPER_RUNTIME_COMM_COMMUNICATOR_H

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/support/Status.h"

namespace piper::runtime {

/// A communicator key: the logical stream that issues the operations and the
/// world ranks taking part. Every stream has its own connections, so streams
/// never share a Gloo context across threads.
struct CommKey {
  std::string stream;
  std::vector<int> ranks; // sorted, unique, contains this rank
  std::string str() const;
  bool operator<(const CommKey &o) const { return str() < o.str(); }
};

/// Point-to-point and collective operations between the ranks of a run.
/// All calls on one stream come from one thread; different streams may be
/// used concurrently. Errors name the peer rank(s).
class Communicator {
public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int worldSize() const = 0;

  /// Connects every communicator this rank will use. `keys` may come in any
  /// order; they are connected in a globally consistent (sorted) order so that
  /// ranks with different plans never wait on each other crosswise.
  virtual Status connect(std::vector<CommKey> keys) = 0;

  /// Starts sending `bytes` at `data` to world rank `peer`; the buffer must
  /// stay valid until waitSends(stream) returns.
  virtual Status send(const std::string &stream, const void *data,
                      size_t bytes, int peer, uint32_t tag) = 0;
  /// Receives exactly `bytes` from `peer` into `data` (blocking).
  virtual Status recv(const std::string &stream, void *data, size_t bytes,
                      int peer, uint32_t tag) = 0;
  /// Waits for every send started on `stream`.
  virtual Status waitSends(const std::string &stream) = 0;
  /// In-place sum of `count` floats over `ranks` (which must have been
  /// connected on `stream`).
  virtual Status allReduceSum(const std::string &stream,
                              const std::vector<int> &ranks, float *data,
                              size_t count) = 0;
  /// In-place sum over all ranks, on a dedicated control connection (used
  /// for step metrics such as the loss).
  virtual Status allReduceSumWorld(double *data, size_t count) = 0;
};

/// Creates a Gloo communicator over TCP on 127.0.0.1 (or `hostname`), meeting
/// the other ranks through a file store in `storeDir`. Operations that wait
/// longer than `timeout` fail with an error naming the peer. Sets SIGPIPE to
/// be ignored (unless a handler is installed) so a dead peer is an error.
std::unique_ptr<Communicator>
createGlooCommunicator(int rank, int worldSize, const std::string &storeDir,
                       std::chrono::milliseconds timeout, Status &status,
                       const std::string &hostname = "127.0.0.1");

} // namespace piper::runtime

#endif // PIPER_RUNTIME_COMM_COMMUNICATOR_H
