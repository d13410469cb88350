module {
  piper.param @wte : tensor<4000000000x8xf32> init zeros(0.000000e+00)
}
