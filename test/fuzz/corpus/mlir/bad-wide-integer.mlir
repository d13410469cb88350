module attributes {piper.x = 1 : i16777215} {}
