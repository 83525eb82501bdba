// Checks that a PNG is a real, non-trivial image: signature, IHDR size, and (decoded by matplotlib in the
// embedded interpreter) more than a handful of distinct colours.
#pragma once
#include <pybind11/embed.h>

#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>

#include "search/OptunaBridge.h"

namespace bs::test {

struct PngInfo {
  bool signature_ok = false;
  uint32_t width = 0, height = 0;
  std::size_t bytes = 0;
  long distinct_colours = 0;
};

inline std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline PngInfo inspect_png(const std::string& path) {
  PngInfo info;
  const std::string b = file_bytes(path);
  info.bytes = b.size();
  static const std::string sig("\x89PNG\r\n\x1a\n", 8);
  info.signature_ok = b.size() > 24 && b.compare(0, 8, sig) == 0 && b.compare(12, 4, "IHDR") == 0;
  if (!info.signature_ok) return info;
  auto be32 = [&](std::size_t at) {
    return (uint32_t)(unsigned char)b[at] << 24 | (uint32_t)(unsigned char)b[at + 1] << 16 |
           (uint32_t)(unsigned char)b[at + 2] << 8 | (uint32_t)(unsigned char)b[at + 3];
  };
  info.width = be32(16);
  info.height = be32(20);
  bs::search::ensure_python();
  namespace py = pybind11;
  py::module_ np = py::module_::import("numpy");
  py::object img = py::module_::import("matplotlib.image").attr("imread")(path);
  py::object flat = img.attr("reshape")(-1, img.attr("shape")[py::int_(2)]);
  info.distinct_colours = py::len(np.attr("unique")(flat, py::arg("axis") = 0));
  return info;
}

}  // namespace bs::test
