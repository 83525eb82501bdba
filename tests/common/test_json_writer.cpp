#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include "common/JsonWriter.h"

// Arrays are written like single numbers: full precision, null for NaN and infinity, ", " between entries.
TEST(JsonWriter, ArraysOfNumbersKeepFullPrecisionAndWriteNonFiniteAsNull) {
  const double inf = std::numeric_limits<double>::infinity();
  const std::string json = bs::JsonWriter()
                               .add("step", int64_t{3})
                               .add("xs", std::vector<double>{2048, 0.1, std::nan(""), -inf})
                               .add("none", std::vector<double>{})
                               .add("x", 0.1)
                               .str();
  EXPECT_EQ(json,
            "{\"step\": 3, \"xs\": [2048, 0.10000000000000001, null, null], \"none\": [], \"x\": "
            "0.10000000000000001}");
  // Every finite value reads back exactly.
  for (double v : {1.0 / 3, 6.02214076e23, -2.5e-300}) {
    const std::string one = bs::JsonWriter().add("v", std::vector<double>{v}).str();  // {"v": [...]}
    EXPECT_EQ(std::strtod(one.c_str() + 7, nullptr), v) << one;
  }
}
