// Multi-process tests of the run-time-counts all-to-all protocol
// (exchangeRowCounts) over Gloo: uneven counts move the right rows, and a
// bad count or an overflow on one member fails every member, never hangs.
#include "runtime/comm/RowExchange.h"
#include "runtime/comm/test_ranks.h"

namespace piper::runtime {
namespace {

using namespace testranks;

constexpr int kWorld = 3;
const CommKey kGroup{"ep", {0, 1, 2}};

/// Rank r sends (r + j) % 3 rows to member j: rank 0 sends 0, 1, 2 rows.
int32_t rowsFrom(int r, int j) { return (r + j) % 3; }

TEST_CASE("an all-to-all with run-time counts moves every row", "[comm]") {
  auto codes = runRanks(kWorld, 20s, [&](int rank, const std::string &dir) {
    auto comm = makeComm(rank, kWorld, dir, 5000ms);
    CHILD_CHECK(comm);
    CHILD_OK(comm->connect({kGroup}));
    const int64_t rowElements = 2, inputRows = 4, outputRows = 6;
    std::vector<int32_t> send(kWorld), recv;
    for (int j = 0; j < kWorld; ++j)
      send[j] = rowsFrom(rank, j);
    CHILD_OK(exchangeRowCounts(comm.get(), kGroup, rank, inputRows, outputRows,
                               send, recv, "all-to-all"));
    for (int j = 0; j < kWorld; ++j)
      CHILD_CHECK(recv[j] == rowsFrom(j, rank));
    // Row k of rank r's input holds (r, k) in i32; the rows for member j
    // follow those for members before it.
    std::vector<int32_t> in(inputRows * rowElements),
        out(outputRows * rowElements, -7);
    for (int64_t k = 0; k < inputRows; ++k) {
      in[k * 2] = rank;
      in[k * 2 + 1] = static_cast<int32_t>(k);
    }
    std::vector<size_t> sendElems(kWorld), recvElems(kWorld);
    for (int j = 0; j < kWorld; ++j) {
      sendElems[j] = static_cast<size_t>(send[j] * rowElements);
      recvElems[j] = static_cast<size_t>(recv[j] * rowElements);
    }
    CHILD_OK(comm->allToAll(kGroup, in.data(), sendElems, out.data(),
                            recvElems, CommDType::I32)
                 ->wait());
    int64_t row = 0;
    for (int j = 0; j < kWorld; ++j) {
      int64_t first = 0; // the first row member j sends to this rank
      for (int m = 0; m < rank; ++m)
        first += rowsFrom(j, m);
      for (int32_t k = 0; k < recv[j]; ++k, ++row) {
        CHILD_CHECK(out[row * 2] == j);
        CHILD_CHECK(out[row * 2 + 1] == first + k);
      }
    }
    CHILD_CHECK(out[row * 2] == -7); // rows after the received ones untouched
    return 0;
  });
  requireAllPassed(codes);
}

TEST_CASE("a negative count on one member fails every member", "[comm]") {
  auto codes = runRanks(kWorld, 20s, [&](int rank, const std::string &dir) {
    auto comm = makeComm(rank, kWorld, dir, 5000ms);
    CHILD_CHECK(comm);
    CHILD_OK(comm->connect({kGroup}));
    std::vector<int32_t> send = {1, 1, 1}, recv;
    if (rank == 1)
      send[2] = -3;
    Status st = exchangeRowCounts(comm.get(), kGroup, rank, 4, 8, send, recv,
                                  "all-to-all over ranks [0, 1, 2]");
    if (rank == 1)
      CHILD_FAILS_WITH(st, "rank 1 has a negative send count (-3) for rank 2");
    else
      CHILD_FAILS_WITH(st, "rank 1 has invalid send counts");
    return 0;
  });
  requireAllPassed(codes);
}

TEST_CASE("sending more rows than the input holds fails every member",
          "[comm]") {
  auto codes = runRanks(kWorld, 20s, [&](int rank, const std::string &dir) {
    auto comm = makeComm(rank, kWorld, dir, 5000ms);
    CHILD_CHECK(comm);
    CHILD_OK(comm->connect({kGroup}));
    std::vector<int32_t> send = {2, 2, rank == 0 ? 2 : 0}, recv;
    Status st = exchangeRowCounts(comm.get(), kGroup, rank, 4, 8, send, recv,
                                  "all-to-all");
    if (rank == 0)
      CHILD_FAILS_WITH(st, "rank 0 sends 6 rows but its input holds 4");
    else
      CHILD_FAILS_WITH(st, "rank 0 has invalid send counts");
    return 0;
  });
  requireAllPassed(codes);
}

TEST_CASE("receiving more rows than the output holds fails every member",
          "[comm]") {
  auto codes = runRanks(kWorld, 20s, [&](int rank, const std::string &dir) {
    auto comm = makeComm(rank, kWorld, dir, 5000ms);
    CHILD_CHECK(comm);
    CHILD_OK(comm->connect({kGroup}));
    // Everyone sends 3 rows to rank 2, whose output holds 8.
    std::vector<int32_t> send = {0, 0, 3}, recv;
    Status st = exchangeRowCounts(comm.get(), kGroup, rank, 3, 8, send, recv,
                                  "all-to-all");
    if (rank == 2)
      CHILD_FAILS_WITH(st, "rank 2 receives 9 rows but its output holds 8");
    else
      CHILD_FAILS_WITH(st, "another member receives more rows");
    return 0;
  });
  requireAllPassed(codes);
}

TEST_CASE("a group of one needs no communicator", "[comm]") {
  std::vector<int32_t> recv;
  REQUIRE(exchangeRowCounts(nullptr, {"ep", {5}}, 5, 4, 4, {3}, recv, "a2a")
              .isOk());
  REQUIRE(recv == std::vector<int32_t>{3});
  Status st = exchangeRowCounts(nullptr, {"ep", {5}}, 5, 4, 2, {3}, recv, "a2a");
  REQUIRE(!st.isOk());
  REQUIRE(st.message().find("receives 3 rows but its output holds 2") !=
          std::string::npos);
}

} // namespace
} // namespace piper::runtime
