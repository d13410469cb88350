// Verifiers and builders of the communication ops: transfers and the
// value-level collectives (all-reduce, reduce-scatter, all-gather,
// all-to-all).
#include "dialects/piper/PiperDialect.h"
#include "support/BalancedSplit.h"

using namespace mlir;
using namespace mlir::piper;

SmallVector<int64_t> mlir::piper::balancedSlices(int64_t rows,
                                                 int64_t members) {
  SmallVector<int64_t> out;
  if (members <= 0)
    return out;
  for (int64_t i = 0; i < members; ++i)
    out.push_back(::piper::shardRange(rows, members, i).count);
  return out;
}

LogicalResult TransferOp::verify() {
  if (getFrom().size() != getTo().size())
    return emitOpError("from and to must have the same size (")
           << getFrom().size() << " vs " << getTo().size() << ")";
  if (getInput().getType() != getResult().getType())
    return emitOpError("result type must equal the input type");
  return success();
}

/// What every collective checks: its group and its collective id.
static LogicalResult verifyCollective(Operation *op) {
  auto c = cast<CollectiveOpInterface>(op);
  if (std::optional<uint64_t> id = c.getCollective();
      id && static_cast<int64_t>(*id) < 0)
    return op->emitOpError("collective id must be non-negative, got ")
           << static_cast<int64_t>(*id);
  ArrayAttr sub = c.getSubgroupsAttr();
  if (!sub)
    return success();
  if (sub.empty())
    return op->emitOpError("subgroups, when given, are at least one group");
  llvm::SmallDenseSet<int64_t> covered;
  DeviceGroupAttr devices = c.getDevices();
  // A set, not DeviceGroupAttr::contains: that scans the group, which made
  // verifying a world's subgroups quadratic in its size (issue 42 item 3).
  llvm::DenseSet<int64_t> inGroup(devices.begin(), devices.end());
  size_t size = cast<DeviceGroupAttr>(sub[0]).size();
  for (Attribute a : sub) {
    auto g = cast<DeviceGroupAttr>(a);
    if (g.size() != size)
      return op->emitOpError("subgroups must have one size, got ")
             << size << " and " << g.size() << " members";
    ArrayRef<int64_t> m = g.getMembers();
    for (size_t i = 0; i < m.size(); ++i) {
      if (i > 0 && m[i - 1] >= m[i])
        return op->emitOpError("subgroup members must be listed in "
                               "increasing order");
      if (!inGroup.contains(m[i]))
        return op->emitOpError("subgroup member ")
               << m[i] << " is not in the group";
      if (!covered.insert(m[i]).second)
        return op->emitOpError("device ") << m[i] << " is in two subgroups";
    }
  }
  if (covered.size() != devices.size())
    return op->emitOpError("the subgroups must cover the group: ")
           << covered.size() << " of its " << devices.size()
           << " devices are in one";
  return success();
}

/// Slicing collectives number members by rank: member i is the i-th
/// smallest device.
static LogicalResult verifyMemberOrder(Operation *op) {
  ArrayRef<int64_t> d =
      cast<CollectiveOpInterface>(op).getDevices().getMembers();
  for (size_t i = 1; i < d.size(); ++i)
    if (d[i - 1] >= d[i])
      return op->emitOpError("devices must be listed in increasing order: "
                             "member i is the i-th smallest rank");
  return success();
}

/// `input` and `result` differ at most in dimension 0 and have one element
/// type.
static LogicalResult verifyRowsOnly(Operation *op, RankedTensorType input,
                                    RankedTensorType result) {
  if (input.getElementType() != result.getElementType())
    return op->emitOpError("result element type ")
           << result.getElementType() << " differs from the input's "
           << input.getElementType();
  if (input.getRank() != result.getRank() ||
      input.getShape().drop_front() != result.getShape().drop_front())
    return op->emitOpError("input ") << input << " and result " << result
                                     << " must differ in dimension 0 only";
  return success();
}

static int64_t ceilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

void AllReduceOp::build(OpBuilder &b, OperationState &state, ArrayAttr grads,
                        ValueRange deps, DeviceGroupAttr devices,
                        StreamAttr stream, TagAttr tag,
                        IntegerAttr collective) {
  build(b, state, TypeRange(), b.getType<TokenType>(), ValueRange(), grads,
        deps, devices, stream, tag, collective, /*subgroups=*/ArrayAttr());
}

void AllReduceOp::build(OpBuilder &b, OperationState &state, ValueRange inputs,
                        ValueRange deps, DeviceGroupAttr devices,
                        StreamAttr stream, TagAttr tag) {
  build(b, state, inputs.getTypes(), b.getType<TokenType>(), inputs,
        ArrayAttr(), deps, devices, stream, tag, IntegerAttr(),
        /*subgroups=*/ArrayAttr());
}

LogicalResult AllReduceOp::verify() {
  if (failed(verifyCollective(*this)))
    return failure();
  bool hasGrads = getGrads().has_value();
  if (hasGrads == !getInputs().empty())
    return emitOpError("sums either tensors (inputs) or gradient "
                       "accumulators (grads), exactly one of them");
  if (hasGrads && getGrads()->empty())
    return emitOpError("must reduce at least one parameter");
  if (getInputs().getTypes() != getResults().getTypes())
    return emitOpError("results must have the types of the inputs");
  for (Type t : getInputs().getTypes())
    if (!cast<RankedTensorType>(t).getElementType().isF32())
      return emitOpError("sums f32 tensors, not ") << t;
  return success();
}

/// A reduce-scatter or all-gather between the whole tensor `full` and the
/// slice buffer: they differ only in rows,
/// and the slice holds the largest balanced slice, ceil(rows / members).
static LogicalResult verifySlices(Operation *op, RankedTensorType in,
                                  RankedTensorType out, bool scatter) {
  if (failed(verifyCollective(op)) || failed(verifyMemberOrder(op)) ||
      failed(verifyRowsOnly(op, in, out)))
    return failure();
  if (scatter && !in.getElementType().isF32())
    return op->emitOpError("sums f32 tensors, not ") << in;
  RankedTensorType full = scatter ? in : out, slice = scatter ? out : in;
  int64_t members = cast<CollectiveOpInterface>(op).getGroupSize();
  int64_t want = ceilDiv(full.getDimSize(0), members);
  if (slice.getDimSize(0) != want)
    return op->emitOpError(scatter ? "result" : "input")
           << " must have ceil(" << full.getDimSize(0) << " / " << members
           << ") = " << want << " rows, the largest slice, not "
           << slice.getDimSize(0);
  return success();
}

LogicalResult ReduceScatterOp::verify() {
  return verifySlices(*this, cast<RankedTensorType>(getInput().getType()),
                      cast<RankedTensorType>(getResult().getType()),
                      /*scatter=*/true);
}

LogicalResult AllGatherOp::verify() {
  return verifySlices(*this, cast<RankedTensorType>(getInput().getType()),
                      cast<RankedTensorType>(getResult().getType()),
                      /*scatter=*/false);
}

LogicalResult AllToAllOp::verify() {
  if (failed(verifyCollective(*this)) || failed(verifyMemberOrder(*this)))
    return failure();
  auto in = cast<RankedTensorType>(getInput().getType());
  auto out = cast<RankedTensorType>(getResult().getType());
  if (failed(verifyRowsOnly(*this, in, out)))
    return failure();
  for (Value counts : {getSendCounts(), getRecvCounts()}) {
    auto t = cast<RankedTensorType>(counts.getType());
    if (t.getDimSize(0) != getGroupSize())
      return emitOpError("counts must have one entry per member (")
             << getGroupSize() << "), not " << t.getDimSize(0);
  }
  return success();
}

/// What both ZeRO collectives check: a stage of 1 to 3, one group in rank
/// order (with the strided subgroups of tensor parallelism, or none),
/// parameters named once, and whole-tensor buffers (`values`, when present) of
/// the parameters' types.
static LogicalResult verifyZeroCollective(Operation *op, ArrayAttr params,
                                          int64_t zero, TypeRange values) {
  if (failed(verifyCollective(op)) || failed(verifyMemberOrder(op)))
    return failure();
  auto c = cast<CollectiveOpInterface>(op);
  if (zero < 1 || zero > 3)
    return op->emitOpError("zero must be the ZeRO stage 1, 2 or 3, not ")
           << zero;
  // Under tensor parallelism each member shards over its data replicas:
  // subgroup t is members t, t + T, ... of the group (T subgroups).
  if (ArrayAttr sub = c.getSubgroupsAttr()) {
    ArrayRef<int64_t> all = c.getDevices().getMembers();
    size_t tp = sub.size();
    bool strided = tp >= 2 && all.size() % tp == 0;
    for (size_t t = 0; strided && t < tp; ++t) {
      ArrayRef<int64_t> g = cast<DeviceGroupAttr>(sub[t]).getMembers();
      strided = g.size() == all.size() / tp && g.size() >= 2;
      for (size_t k = 0; strided && k < g.size(); ++k)
        strided = g[k] == all[t + k * tp];
    }
    if (!strided)
      return op->emitOpError(
          "shards over its whole group, or under tensor parallelism over "
          "the data replicas of each member: subgroups {t, t + T, ...} of "
          "at least 2");
  }
  if (c.getCollective())
    return op->emitOpError("runs within one device class: no collective id");
  if (params.empty())
    return op->emitOpError("must name at least one parameter");
  llvm::SmallDenseSet<Attribute> seen;
  for (Attribute a : params)
    if (!seen.insert(a).second)
      return op->emitOpError("names parameter ") << a << " twice";
  if (!values.empty() && values.size() != params.size())
    return op->emitOpError("takes one tensor per parameter (")
           << params.size() << "), not " << values.size();
  return success();
}

LogicalResult ReduceScatterGradsOp::verify() {
  return verifyZeroCollective(*this, getParams(), getZero(),
                              getInputs().getTypes());
}

LogicalResult AllGatherParamsOp::verify() {
  if (failed(verifyZeroCollective(*this, getParams(), getZero(),
                                  getResults().getTypes())))
    return failure();
  if (!getResults().empty() && getZero() != 3)
    return emitOpError("gathers into new tensors only under ZeRO-3 (the "
                       "parameters are shards); stage ")
           << getZero() << " gathers in place";
  return success();
}
