module attributes {piper.x = 999999999999999999999 : i64} {}
