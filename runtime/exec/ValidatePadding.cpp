// The plan validator's check of the compiler's vocabulary padding
// (docs/kernels.md, "Padded vocabulary"): values a kernel writes with padded
// rows, and who may touch them.
#include <algorithm>

#include "proto/KernelIds.h"
#include "runtime/exec/ValidateInternal.h"

namespace piper::runtime::validate {

using plan::Operand;

namespace {
// The kernel's `valid_cols`: 0 without it, -1 where it is not a positive
// integer.
int64_t validColsOf(const plan::Kernel &kernel) {
  auto it = kernel.attrs().find("valid_cols");
  if (it == kernel.attrs().end())
    return 0;
  const plan::AttrValue &a = it->second;
  if (a.value_case() == plan::AttrValue::kI)
    return a.i() > 0 ? a.i() : -1;
  if (a.value_case() == plan::AttrValue::kF && a.f() >= 1 && a.f() < 0x1p62 &&
      a.f() == static_cast<double>(static_cast<int64_t>(a.f())))
    return static_cast<int64_t>(a.f());
  return -1;
}

std::string paddedRows(const plan::TensorType &type, int64_t valid) {
  return shapeString(type) + ", rows padded to " +
         std::to_string(type.shape(1)) + " columns of which " +
         std::to_string(valid) + " valid";
}
} // namespace

Status checkPaddedValues(const plan::Segment &seg, const std::string &where) {
  auto kernelWhere = [&](int k) {
    return where + ", kernel " + std::to_string(k) + " ('" +
           seg.kernels(k).op() + "')";
  };
  // The values kernels write padded: more columns than their valid_cols
  // at an operand of the vocabulary dimension.
  std::vector<int64_t> validOf(seg.values_size(), 0);
  for (int k = 0; k < seg.kernels_size(); ++k) {
    const plan::Kernel &kernel = seg.kernels(k);
    const int64_t valid = validColsOf(kernel);
    if (valid == 0)
      continue;
    const plan::PaddedOperands *padded = plan::findPaddedOperands(kernel.op());
    if (!padded)
      return Status::error(kernelWhere(k) +
                           ": has valid_cols, but no padded form (only "
                           "linear, linear_grad_input, linear_grad_weight "
                           "and the cross_entropy kernels take padded "
                           "operands)");
    if (valid < 0)
      return Status::error(kernelWhere(k) +
                           ": attribute 'valid_cols' must be a positive "
                           "integer");
    for (int i : padded->outputs) {
      if (i >= kernel.outputs_size() ||
          kernel.outputs(i).kind() != Operand::VALUE)
        continue;
      const int v = kernel.outputs(i).index();
      const plan::TensorType &type = seg.values(v);
      if (type.shape_size() != 2 || type.shape(1) <= valid)
        continue;
      if (validOf[v] != 0 && validOf[v] != valid)
        return Status::error(
            kernelWhere(k) + " output " + std::to_string(i) +
            ": writes value " + std::to_string(v) +
            " with valid_cols=" + std::to_string(valid) +
            ", another kernel with valid_cols=" + std::to_string(validOf[v]));
      validOf[v] = valid;
    }
  }
  // Every kernel touching a padded value takes it at a padded operand with
  // the same valid_cols: no other reads the padding, which nothing writes.
  for (int k = 0; k < seg.kernels_size(); ++k) {
    const plan::Kernel &kernel = seg.kernels(k);
    const plan::PaddedOperands *padded = plan::findPaddedOperands(kernel.op());
    const int64_t valid = validColsOf(kernel);
    auto check = [&](const Operand &o, bool output, int i) -> Status {
      if (o.kind() != Operand::VALUE || validOf[o.index()] == 0)
        return Status::ok();
      const std::vector<int> *at =
          padded ? (output ? &padded->outputs : &padded->inputs) : nullptr;
      if (valid == validOf[o.index()] && at &&
          std::find(at->begin(), at->end(), i) != at->end())
        return Status::ok();
      return Status::error(
          kernelWhere(k) + (output ? " output " : " input ") +
          std::to_string(i) + ": value " + std::to_string(o.index()) +
          " is stored " +
          paddedRows(seg.values(o.index()), validOf[o.index()]) +
          ", which this kernel does not take there (only a padded operand "
          "with the same valid_cols may)");
    };
    for (int i = 0; i < kernel.inputs_size(); ++i)
      PIPER_RETURN_IF_ERROR(check(kernel.inputs(i), false, i));
    for (int i = 0; i < kernel.outputs_size(); ++i)
      PIPER_RETURN_IF_ERROR(check(kernel.outputs(i), true, i));
  }
  for (int r : seg.results())
    if (validOf[r] != 0)
      return Status::error(where + ": result value " + std::to_string(r) +
                           " is stored " +
                           paddedRows(seg.values(r), validOf[r]) +
                           "; step buffers are dense, so a result may not be");
  return Status::ok();
}

} // namespace piper::runtime::validate
