// Parses, but a task calls a segment that does not exist.
module {
  piper.program @model {
    %d = piper.task @missing() {tag = #piper.tag<block = 0>} : () -> !piper.token
  }
}
