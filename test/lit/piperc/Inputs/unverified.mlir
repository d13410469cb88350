// Parses, but a task calls a segment that does not exist.
module {
  piper.program @model {
    %d = piper.task @missing() {tag = {block = 0 : i64}} : () -> !piper.token
  }
}
