// Not a piper model: an unknown op.
module {
  piper.bogus
}
