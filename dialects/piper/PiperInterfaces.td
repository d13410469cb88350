// Op interfaces of the piper dialect.
#ifndef PIPER_INTERFACES_TD
#define PIPER_INTERFACES_TD

include "mlir/IR/OpBase.td"

def Piper_CostOpInterface : OpInterface<"CostOpInterface"> {
  let cppNamespace = "::mlir::piper";
  let description = [{
    The cost of one execution of a segment op: floating-point operations and
    bytes moved. `stage` balances pipeline stages by the FLOPs of their
    segments; a simulator can turn both into time with a machine
    description. The defaults count one operation per result element and
    every tensor operand and result once; ops whose work is not linear in
    their output (matrix products, attention) override `getFlops`.
  }];
  let methods = [
    InterfaceMethod<[{
        Floating-point operations of one execution.
      }],
      "double", "getFlops", (ins), /*methodBody=*/"",
      /*defaultImplementation=*/[{
        return ::mlir::piper::countResultElements($_op.getOperation());
      }]>,
    InterfaceMethod<[{
        Bytes read and written by one execution.
      }],
      "double", "getBytesMoved", (ins), /*methodBody=*/"",
      /*defaultImplementation=*/[{
        return ::mlir::piper::countTensorBytes($_op.getOperation());
      }]>,
  ];
}

#endif // PIPER_INTERFACES_TD
