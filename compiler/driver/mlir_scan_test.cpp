// The MLIR pre-scan: what it refuses (nesting of every kind, long numbers)
// and what it must let through.
#include "compiler/driver/MlirScan.h"

#include <string>

#include <catch2/catch.hpp>

using mlir::piper::driver::kMaxMlirNesting;
using mlir::piper::driver::scanMlirText;

namespace {

std::string repeat(const std::string &s, int n) {
  std::string out;
  for (int i = 0; i < n; ++i)
    out += s;
  return out;
}

/// An attribute of the module: one level ({) before `value`.
std::string moduleWith(const std::string &value) {
  return "module attributes {piper.x = " + value + "} {}\n";
}

bool refuses(const std::string &text, const std::string &part) {
  std::string err = scanMlirText(text);
  INFO("error: " << err);
  return err.find(part) != std::string::npos;
}

} // namespace

TEST_CASE("brackets and regions nest at most kMaxMlirNesting deep") {
  int inside = kMaxMlirNesting - 1; // the attribute dictionary is one level
  CHECK(scanMlirText(moduleWith(repeat("[", inside) + repeat("]", inside))) ==
        "");
  CHECK(scanMlirText(
            moduleWith(repeat("[", inside + 1) + repeat("]", inside + 1))) ==
        "nests brackets or regions more than 256 levels deep (line 1, "
        "column 285)");
  // Regions and every bracket kind count together.
  CHECK(refuses(repeat("\"a.b\"() ({\n", 100) + repeat("[(<", 60),
                "nests brackets or regions"));
  // Brackets in strings and comments are not nesting.
  std::string quoted = "\"" + repeat("[", 1000) + "\"";
  CHECK(scanMlirText(moduleWith(quoted) + "// " + repeat("{", 1000)) == "");
  // Closing brackets in strings do not hide real nesting either.
  CHECK(refuses(moduleWith(repeat("[\"]]]\"", 300)), "nests brackets"));
  // Standard input and files go through the same scan: the error names the
  // line and column.
  CHECK(refuses("\n\n  " + repeat("(", 300), "(line 3, column 259)"));
}

TEST_CASE("affine expressions count each operator as a level") {
  // 10,000 unary minus signs, or a 50,000-term sum, in a 20 KB file
  // overflowed the parser's stack.
  CHECK(
      refuses(moduleWith("affine_map<(d0) -> (" + repeat("- ", 10000) + "d0)>"),
              "nests an affine expression (each operator a level) more "
              "than 256 levels deep"));
  std::string sum = "d0";
  for (int i = 0; i < 50000; ++i)
    sum += " + d0";
  CHECK(refuses(moduleWith("affine_set<(d0) : (" + sum + " >= 0)>"),
                "nests an affine expression"));
  CHECK(refuses(
      moduleWith("affine_map<(d0) -> (d0" + repeat(" mod 7", 300) + ")>"),
      "nests an affine expression"));
  // 200 terms, and many results of few terms each, are fine: a comma ends
  // an expression.
  std::string terms = "d0" + repeat(" + d0", 200);
  CHECK(scanMlirText(moduleWith("affine_map<(d0) -> (" + terms + ")>")) == "");
  std::string results = "d0 + 1" + repeat(", d0 * 2 + 1", 2000);
  CHECK(scanMlirText(moduleWith("affine_map<(d0) -> (" + results + ")>")) ==
        "");
  // The arrow and >= close nothing; minus signs outside affine maps are
  // numbers, not levels.
  CHECK(scanMlirText(moduleWith("affine_set<(d0)[s0] : (d0 - s0 >= 0, d0 == "
                                "0)>")) == "");
  CHECK(scanMlirText(moduleWith("[" + repeat("-1, ", 5000) + "-1]")) == "");
}

TEST_CASE("an alias counts with the nesting of its definition") {
  // 100,000 aliases, each one list around the one before, crashed
  // piper-opt in the printer; types alike.
  std::string chain = "#a0 = [0]\n";
  for (int i = 1; i < 300; ++i)
    chain +=
        "#a" + std::to_string(i) + " = [#a" + std::to_string(i - 1) + "]\n";
  CHECK(refuses(chain + moduleWith("#a299"),
                "nests brackets through aliases more than 256 levels deep "
                "(line 257"));
  std::string types = "!t0 = tuple<i32>\n";
  for (int i = 1; i < 300; ++i)
    types += "!t" + std::to_string(i) + " = tuple<!t" + std::to_string(i - 1) +
             ">\n";
  CHECK(refuses(types, "through aliases"));
  // A short chain is fine, and a definition ends where the module starts:
  // the module's nesting is not the alias's.
  std::string shortChain = "#a0 = [0]\n#a1 = [#a0]\n#map = affine_map<(d0) "
                           "-> (d0 + 1)>\n";
  std::string deep = repeat("[", 200) + "#map, #a1" + repeat("]", 200);
  std::string body =
      "module {\n" +
      repeat("  \"t.op\"() {x = " + deep + "} : () -> ()\n", 50) + "}\n";
  CHECK(scanMlirText(shortChain + body) == "");
  // Location aliases after the module, used before their definition.
  CHECK(scanMlirText("\"t.op\"() : () -> () loc(#loc1)\n#loc0 = "
                     "loc(\"f\":1:2)\n#loc1 = loc(fused[#loc0, #loc0])\n") ==
        "");
}

TEST_CASE("numbers are at most kMaxMlirNumberChars characters") {
  // A 100,000-digit integer took minutes to convert; a 40,000-digit
  // fraction crashed.
  CHECK(refuses(moduleWith(repeat("1", 100000)),
                "has a number of 100000 characters, more than the limit of "
                "1000 (line 1, column 30)"));
  CHECK(refuses(moduleWith("1." + repeat("1", 40000)), "has a number of"));
  CHECK(refuses(moduleWith("0x" + repeat("f", 1000)), "has a number of"));
  CHECK(scanMlirText(moduleWith("1." + repeat("9", 998))) == "");
  // Shapes, names and hex strings are not numbers.
  CHECK(scanMlirText(moduleWith("tensor<" + repeat("1x", 2000) + "f32>")) ==
        "");
  CHECK(scanMlirText("%" + repeat("1", 5000) + " = \"t.op\"() : () -> i32\n") ==
        "");
  CHECK(scanMlirText(moduleWith("dense<\"0x" + repeat("AB", 5000) +
                                "\"> : tensor<5000xi8>")) == "");
}

TEST_CASE("integer types are at most 64 bits, integer literals 20 digits") {
  // 4,000 attributes of i16777215 (71 KB) took gigabytes; 10,000 999-digit
  // i4096 integers 48 s.
  CHECK(scanMlirText(moduleWith("1 : i16777215")) ==
        "has an integer type of more than 64 bits (i16777215) (line 1, "
        "column 34)");
  CHECK(refuses(moduleWith("1 : si65"), "more than 64 bits (si65)"));
  CHECK(refuses(moduleWith("1 : ui128"), "more than 64 bits (ui128)"));
  CHECK(refuses(moduleWith("1 : i" + repeat("9", 30)), "more than 64 bits"));
  // A shape's element type, after a dimension, ? or a scalable [4].
  CHECK(scanMlirText(moduleWith("dense<0> : tensor<4x8xi4096>")) ==
        "has an integer type of more than 64 bits (i4096) (line 1, column "
        "52)");
  CHECK(refuses(moduleWith("dense<0> : tensor<?xi128>"), "(i128)"));
  CHECK(refuses("func.func private @f(vector<[4]xi99>)\n", "(i99)"));
  CHECK(refuses("!t = i65\nmodule {}\n", "(i65)"));
  // Up to 64 bits, and words that only look like types, pass.
  CHECK(scanMlirText(moduleWith("[1 : i1, 2 : si8, 3 : ui64, 4 : i64]")) ==
        "");
  CHECK(scanMlirText(moduleWith("dense<0> : tensor<2x?x4xi64>")) == "");
  CHECK(scanMlirText("module attributes {xi128 = 1 : i64, x = \"i999\", "
                     "ii128 = 2} {}\n") == "");
  CHECK(scanMlirText("%x128 = \"t.op\"() : () -> i32\n") == "");
  // Integer literals: 2^64 - 1 has 20 digits, 16 hexadecimal ones.
  CHECK(scanMlirText(moduleWith("18446744073709551615 : ui64")) == "");
  CHECK(scanMlirText(moduleWith("0xFFFFFFFFFFFFFFFF : i64")) == "");
  CHECK(scanMlirText(moduleWith(repeat("9", 999) + " : i64")) ==
        "has an integer of 999 digits, more than a 64-bit value has (20) "
        "(line 1, column 30)");
  CHECK(refuses(moduleWith("0x1" + repeat("0", 16) + " : i64"),
                "has an integer of 17 hexadecimal digits"));
  // Fractions and exponents are not integers.
  CHECK(scanMlirText(moduleWith("1." + repeat("0", 500) + "e+05 : f64")) ==
        "");
}

TEST_CASE("file metadata brackets count") {
  CHECK(scanMlirText("module {}\n{-#\n  dialect_resources: {}\n#-}\n") == "");
  CHECK(refuses("{-#" + repeat("{", 300), "nests brackets or regions"));
}
