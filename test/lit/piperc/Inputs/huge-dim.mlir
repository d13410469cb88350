module {
  piper.param @w : tensor<9223372036854775807x8xf32> init zeros(0.000000e+00)
}
