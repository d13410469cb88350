module attributes {t.shape = array<i64: 1, 2, 3>, t.s = "}]>)" , t.u = unit} {
  // A comment with brackets: [[[ {{{ <<<
}
{-#
  dialect_resources: {}
#-}
