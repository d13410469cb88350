// Verifiers and costs of context parallelism's ops (PiperCpOps.td) and of
// the ring exchange node (piper.ring_shift).
#include "dialects/piper/PiperDialect.h"

#include "llvm/ADT/SmallSet.h"

using namespace mlir;
using namespace mlir::piper;

static int64_t dim(Value v, unsigned i) {
  return cast<RankedTensorType>(v.getType()).getDimSize(i);
}

static double elements(Value v) {
  return double(cast<RankedTensorType>(v.getType()).getNumElements());
}

namespace {
/// The attributes every context-parallel attention op shares, and the
/// head dimension they give.
struct RingAttrs {
  int64_t heads, kvHeads, seq, cp;
  std::optional<double> theta;
  bool scaled = false; // rope_scaling
};
} // namespace

/// Checks the shared attributes and the packed q|k|v `qkv` against the
/// output width `width`; sets `hd`.
static LogicalResult verifyRing(Operation *op, const RingAttrs &a, Value qkv,
                                int64_t width, int64_t &hd) {
  if (a.heads <= 0 || a.kvHeads <= 0 || a.seq <= 0)
    return op->emitOpError("heads, kv_heads and seq must be positive");
  if (a.cp < 1)
    return op->emitOpError("cp must be at least 1, got ") << a.cp;
  if (a.seq % (2 * a.cp) != 0)
    return op->emitOpError("seq ")
           << a.seq << " must be a multiple of 2 * cp = " << 2 * a.cp
           << " (each member holds two of 2 * cp equal chunks)";
  if (a.heads % a.kvHeads != 0)
    return op->emitOpError("heads (")
           << a.heads << ") must be a multiple of kv_heads (" << a.kvHeads
           << ")";
  if (width % a.heads != 0)
    return op->emitOpError("width ")
           << width << " is not divisible by " << a.heads << " heads";
  hd = width / a.heads;
  if (dim(qkv, 1) != (a.heads + 2 * a.kvHeads) * hd)
    return op->emitOpError("qkv must have (heads + 2 * kv_heads) * head_dim = ")
           << (a.heads + 2 * a.kvHeads) * hd << " columns, got " << dim(qkv, 1);
  if (a.theta && (hd % 2 != 0 || *a.theta <= 0))
    return op->emitOpError("rotary embeddings need an even head dimension "
                           "and a positive rope_theta");
  if (a.scaled && !a.theta)
    return op->emitOpError("rope_scaling needs rope_theta");
  if (dim(qkv, 0) % (a.seq / a.cp) != 0)
    return op->emitOpError("rows ")
           << dim(qkv, 0)
           << " must be a multiple of seq / cp = " << a.seq / a.cp
           << " (the member's part of each sequence)";
  return success();
}

/// Checks that `v` is [rows, cols].
static LogicalResult verifyShape(Operation *op, Value v, StringRef what,
                                 int64_t rows, int64_t cols) {
  if (dim(v, 0) != rows || dim(v, 1) != cols)
    return op->emitOpError() << what << " must be [" << rows << ", " << cols
                             << "], got " << v.getType();
  return success();
}

template <typename OpT> static RingAttrs ringAttrs(OpT op) {
  std::optional<double> theta;
  if (auto t = op.getRopeTheta())
    theta = t->convertToDouble();
  return RingAttrs{
      static_cast<int64_t>(op.getHeads()),
      static_cast<int64_t>(op.getKvHeads().value_or(op.getHeads())),
      static_cast<int64_t>(op.getSeq()),
      static_cast<int64_t>(op.getCp()),
      theta,
      static_cast<bool>(op.getRopeScalingAttr())};
}

LogicalResult CpAttentionOp::verify() {
  RingAttrs a = ringAttrs(*this);
  int64_t hd, rows = dim(getQkv(), 0);
  if (failed(verifyRing(*this, a, getQkv(), dim(getResult(), 1), hd)) ||
      failed(verifyShape(*this, getResult(), "result", rows, a.heads * hd)) ||
      failed(verifyShape(*this, getLse(), "lse", rows, 2 * a.heads)))
    return failure();
  return success();
}

LogicalResult CpAttentionGradOp::verify() {
  RingAttrs a = ringAttrs(*this);
  int64_t hd, rows = dim(getQkv(), 0);
  if (failed(verifyRing(*this, a, getQkv(), dim(getY(), 1), hd)) ||
      failed(verifyShape(*this, getY(), "y", rows, a.heads * hd)) ||
      failed(verifyShape(*this, getLse(), "lse", rows, 2 * a.heads)) ||
      failed(verifyShape(*this, getGrad(), "grad", rows, a.heads * hd)) ||
      failed(verifyShape(*this, getResult(), "result", rows, dim(getQkv(), 1))))
    return failure();
  return success();
}

/// A ring step's own checks: the step, the key/value shard and the
/// carried values (none at step 0, two after).
static LogicalResult verifyStep(Operation *op, int64_t step, int64_t cp,
                                Value kv, size_t carried, int64_t rows,
                                int64_t kvWidth, bool carryOptional) {
  if (step < 0 || step >= cp)
    return op->emitOpError("step must be in [0, cp = ")
           << cp << "), got " << step;
  if (carryOptional
          ? (step == 0 && carried != 0) || (carried != 0 && carried != 2)
          : (step == 0) != (carried == 0) || (carried != 0 && carried != 2))
    return op->emitOpError(carryOptional
                               ? "step 0 carries nothing and a later step "
                                 "carries nothing or the previous step's two "
                                 "results, got "
                               : "step 0 carries nothing and every later step "
                                 "carries the previous step's two results, "
                                 "got ")
           << carried << " carried value(s) at step " << step;
  return verifyShape(op, kv, "kv", rows, kvWidth);
}

LogicalResult AttentionBlockOp::verify() {
  RingAttrs a = ringAttrs(*this);
  int64_t hd, rows = dim(getQkv(), 0);
  if (failed(verifyRing(*this, a, getQkv(), dim(getResult(), 1), hd)) ||
      failed(verifyStep(*this, getStep(), a.cp, getKv(), getCarry().size(),
                        rows, 2 * a.kvHeads * hd, false)) ||
      failed(verifyShape(*this, getResult(), "result", rows, a.heads * hd)) ||
      failed(verifyShape(*this, getLse(), "lse", rows, 2 * a.heads)))
    return failure();
  if (!getCarry().empty() &&
      (getCarry()[0].getType() != getResult().getType() ||
       getCarry()[1].getType() != getLse().getType()))
    return emitOpError("the carried output and log-sum-exp must have the "
                       "results' types");
  return success();
}

LogicalResult AttentionBlockGradOp::verify() {
  RingAttrs a = ringAttrs(*this);
  int64_t hd, rows = dim(getQkv(), 0);
  if (failed(verifyRing(*this, a, getQkv(), dim(getY(), 1), hd)) ||
      failed(verifyStep(*this, getStep(), a.cp, getKv(), getCarry().size(),
                        rows, 2 * a.kvHeads * hd, true)) ||
      failed(verifyShape(*this, getY(), "y", rows, a.heads * hd)) ||
      failed(verifyShape(*this, getLse(), "lse", rows, 2 * a.heads)) ||
      failed(verifyShape(*this, getGrad(), "grad", rows, a.heads * hd)) ||
      failed(verifyShape(*this, getDq(), "dq", rows, a.heads * hd)) ||
      failed(verifyShape(*this, getDkv(), "dkv", rows, 2 * a.kvHeads * hd)))
    return failure();
  if (!getCarry().empty() && (getCarry()[0].getType() != getDq().getType() ||
                              getCarry()[1].getType() != getDkv().getType()))
    return emitOpError("the carried query and key/value gradients must have "
                       "the results' types");
  return success();
}

/// Where `offset` lands around a ring of `size` members, in [0, size):
/// negative offsets (the backward exchange's -1) go the other way.
static int64_t ringStep(int64_t offset, int64_t size) {
  return (offset % size + size) % size;
}

LogicalResult CpRingShiftOp::verify() {
  int64_t cp = static_cast<int64_t>(getCp());
  if (cp < 2)
    return emitOpError("cp must be at least 2, got ") << cp;
  if (ringStep(getOffset(), cp) == 0)
    return emitOpError("offset ")
           << getOffset() << " moves nothing around a ring of " << cp;
  return success();
}

/// Ulysses' column checks: cp, heads and kv_heads (none: 0; multiples of
/// cp), the wide [n, W] and the narrow [cp n, W / cp] matrices.
static LogicalResult verifyUlyssesColumns(Operation *op, int64_t cp,
                                          int64_t heads,
                                          std::optional<uint64_t> kvHeads,
                                          Value wide, Value narrow) {
  int64_t kv = static_cast<int64_t>(kvHeads.value_or(0));
  if (cp < 2)
    return op->emitOpError("cp must be at least 2, got ") << cp;
  if (heads <= 0 || kv < 0)
    return op->emitOpError("heads must be positive and kv_heads not negative");
  if (heads % cp != 0 || kv % cp != 0)
    return op->emitOpError("heads (")
           << heads << ") and kv_heads (" << kv
           << ") must be multiples of cp = " << cp
           << " (each member attends with its share of the heads)";
  int64_t units = heads + 2 * kv, cols = dim(wide, 1);
  if (cols % units != 0)
    return op->emitOpError("the wide side's ")
           << cols << " columns are not (heads + 2 * kv_heads) = " << units
           << " heads";
  return verifyShape(op, narrow, "the narrow side", cp * dim(wide, 0),
                     cols / cp);
}

/// Ulysses' row checks: rows of whole sequences of `seq`, a multiple of
/// 2 cp.
static LogicalResult verifyUlyssesRows(Operation *op, int64_t cp, int64_t seq,
                                       Value whole) {
  if (cp < 2)
    return op->emitOpError("cp must be at least 2, got ") << cp;
  if (seq <= 0 || seq % (2 * cp) != 0)
    return op->emitOpError("seq ")
           << seq << " must be a positive multiple of 2 * cp = " << 2 * cp
           << " (each member holds two of 2 * cp equal chunks)";
  if (dim(whole, 0) % seq != 0)
    return op->emitOpError("rows ")
           << dim(whole, 0) << " are not whole sequences of " << seq;
  return success();
}

LogicalResult CpSeqToHeadsOp::verify() {
  if (failed(verifyUlyssesColumns(*this, getCp(), getHeads(), getKvHeads(),
                                  getInput(), getResult())))
    return failure();
  return verifyUlyssesRows(*this, getCp(), getSeq(), getResult());
}

LogicalResult CpHeadsToSeqOp::verify() {
  if (failed(verifyUlyssesColumns(*this, getCp(), getHeads(), getKvHeads(),
                                  getResult(), getInput())))
    return failure();
  return verifyUlyssesRows(*this, getCp(), getSeq(), getInput());
}

LogicalResult CpUlyssesSplitOp::verify() {
  if (failed(verifyUlyssesColumns(*this, getCp(), getHeads(), getKvHeads(),
                                  getInput(), getResult())))
    return failure();
  if (dim(getCounts(), 0) != int64_t(getCp()))
    return emitOpError("counts must have cp = ") << getCp() << " entries";
  return success();
}

LogicalResult CpUlyssesMergeOp::verify() {
  return verifyUlyssesColumns(*this, getCp(), getHeads(), getKvHeads(),
                              getResult(), getInput());
}

LogicalResult CpUlyssesNaturalOp::verify() {
  return verifyUlyssesRows(*this, getCp(), getSeq(), getInput());
}

LogicalResult CpUlyssesZigzagOp::verify() {
  if (failed(verifyUlyssesRows(*this, getCp(), getSeq(), getInput())))
    return failure();
  if (getResult().getType() != getInput().getType())
    return emitOpError("result type must equal the input type");
  if (dim(getCounts(), 0) != int64_t(getCp()))
    return emitOpError("counts must have cp = ") << getCp() << " entries";
  return success();
}

LogicalResult CpAllToAllOp::verify() {
  if (getCp() < 2)
    return emitOpError("cp must be at least 2, got ") << getCp();
  if (dim(getSendCounts(), 0) != int64_t(getCp()))
    return emitOpError("send_counts must have cp = ") << getCp() << " entries";
  if (dim(getInput(), 0) % getCp() != 0)
    return emitOpError("rows ")
           << dim(getInput(), 0) << " are not cp = " << getCp()
           << " equal blocks";
  return success();
}

/// The member's rows `part` [rows / cp, C] of the whole sequences `whole`
/// [rows, C]; with `seq` (> 0) rows of whole sequences of seq, a multiple
/// of 2 cp.
static LogicalResult verifyMemberRows(Operation *op, int64_t cp, int64_t seq,
                                      Value whole, Value part) {
  if (cp < 2)
    return op->emitOpError("cp must be at least 2, got ") << cp;
  if (seq && failed(verifyUlyssesRows(op, cp, seq, whole)))
    return failure();
  if (dim(whole, 0) % cp != 0)
    return op->emitOpError("rows ")
           << dim(whole, 0) << " are not cp = " << cp << " equal blocks";
  return verifyShape(op, part, "the member's part", dim(whole, 0) / cp,
                     dim(whole, 1));
}

LogicalResult CpGatherOp::verify() {
  return verifyMemberRows(*this, getCp(), getSeq(), getResult(), getInput());
}
LogicalResult CpGatherGradOp::verify() {
  return verifyMemberRows(*this, getCp(), getSeq(), getInput(), getResult());
}
LogicalResult CpSplitOp::verify() {
  return verifyMemberRows(*this, getCp(), getSeq(), getInput(), getResult());
}
LogicalResult CpSplitGradOp::verify() {
  return verifyMemberRows(*this, getCp(), getSeq(), getResult(), getInput());
}
LogicalResult CpAllGatherOp::verify() {
  return verifyMemberRows(*this, getCp(), 0, getResult(), getInput());
}
LogicalResult CpReduceScatterOp::verify() {
  return verifyMemberRows(*this, getCp(), 0, getInput(), getResult());
}

// Attention's work is 4 FLOPs per output element per key (q k^T and P v);
// a member's rows meet the whole sequence over the ring, seq / cp keys per
// step. The backward does twice the matrix products and recomputes the
// scores: 2.5 times the forward.
double CpAttentionOp::getFlops() {
  return 4.0 * elements(getResult()) * double(getSeq());
}
double CpAttentionGradOp::getFlops() {
  return 10.0 * elements(getY()) * double(getSeq());
}
double AttentionBlockOp::getFlops() {
  return 4.0 * elements(getResult()) * double(getSeq() / getCp());
}
double AttentionBlockGradOp::getFlops() {
  return 10.0 * elements(getY()) * double(getSeq() / getCp());
}

LogicalResult RingShiftOp::verify() {
  DeviceGroupAttr devices = getDevices();
  ArrayAttr rings = getRings();
  if (rings.empty())
    return emitOpError("needs at least one ring");
  size_t size = cast<DeviceGroupAttr>(rings[0]).size();
  if (size < 2)
    return emitOpError("rings must have at least 2 members, got ") << size;
  llvm::DenseSet<int64_t> covered;
  // A set, not DeviceGroupAttr::contains (a scan of the group: quadratic).
  llvm::DenseSet<int64_t> inGroup(devices.begin(), devices.end());
  for (Attribute r : rings) {
    auto g = cast<DeviceGroupAttr>(r);
    if (g.size() != size)
      return emitOpError("rings must have one size, got ")
             << size << " and " << g.size() << " members";
    for (int64_t d : g.getMembers()) {
      if (!inGroup.contains(d))
        return emitOpError("ring member ") << d << " is not in the group";
      if (!covered.insert(d).second)
        return emitOpError("device ") << d << " is in two rings";
    }
  }
  if (covered.size() != devices.size())
    return emitOpError("the rings must cover the group: ")
           << covered.size() << " of its " << devices.size()
           << " devices are in one";
  if (ringStep(getOffset(), int64_t(size)) == 0)
    return emitOpError("offset ")
           << getOffset() << " moves nothing around rings of " << size;
  if (getInput().getType() != getResult().getType())
    return emitOpError("result type must equal the input type");
  return success();
}

SmallVector<int64_t> RingShiftOp::peersAt(int64_t offset) {
  ArrayRef<int64_t> devices = getDevices().getMembers();
  SmallVector<int64_t> peers(devices.size(), -1);
  // Positions looked up, not searched: a search per ring member made
  // lowering a world's rings quadratic in its size (issue 42 item 3).
  llvm::DenseMap<int64_t, size_t> position;
  for (size_t i = 0; i < devices.size(); ++i)
    position.try_emplace(devices[i], i);
  for (Attribute r : getRings()) {
    ArrayRef<int64_t> ring = cast<DeviceGroupAttr>(r).getMembers();
    int64_t n = static_cast<int64_t>(ring.size());
    for (int64_t k = 0; k < n; ++k) {
      int64_t to = ring[((k + offset) % n + n) % n];
      auto it = position.find(ring[k]);
      if (it != position.end()) // the verifier keeps rings in the group
        peers[it->second] = to;
    }
  }
  return peers;
}
