func.func private @f(tensor<4x?xi128>)
