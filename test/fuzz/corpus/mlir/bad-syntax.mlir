module attributes {t.x = [1, 2} {}
