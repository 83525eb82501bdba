#include "common/OutputPath.h"

#include <unistd.h>

#include <filesystem>

#include "common/Errors.h"

namespace bs {

namespace fs = std::filesystem;

namespace {

bool writable_folder(const fs::path& p) { return access(p.c_str(), W_OK | X_OK) == 0; }

}  // namespace

void check_output_file(const std::string& what, const std::string& path) {
  if (path.empty()) return;
  std::error_code ec;
  const fs::path p(path);
  if (fs::is_directory(p, ec))
    throw ConfigError(what + " " + path + ": is a folder; give a file name (e.g. " + (p / "out").string() + ")");
  if (fs::exists(p, ec) && !fs::is_regular_file(p, ec))
    throw ConfigError(what + " " + path + ": exists and is not a regular file; give another file name");
  const fs::path parent = p.has_parent_path() ? p.parent_path() : fs::path(".");
  if (!fs::exists(parent, ec))
    throw ConfigError(what + " " + path + ": the folder " + parent.string() + " does not exist (create it first)");
  if (!fs::is_directory(parent, ec))
    throw ConfigError(what + " " + path + ": " + parent.string() + " is a file, not a folder");
  if (!writable_folder(parent))
    throw ConfigError(what + " " + path + ": the folder " + parent.string() + " is not writable");
  if (fs::exists(p, ec) && access(p.c_str(), W_OK) != 0)
    throw ConfigError(what + " " + path + ": the file exists and is not writable");
}

void check_output_folder(const std::string& what, const std::string& path) {
  if (path.empty()) return;
  std::error_code ec;
  fs::path p = fs::absolute(path, ec);
  if (fs::exists(p, ec) && !fs::is_directory(p, ec))
    throw ConfigError(what + " " + path + ": is a file, not a folder; give a folder path");
  // The nearest existing ancestor: every missing part is created beneath it.
  fs::path existing = p;
  while (!fs::exists(existing, ec) && existing.has_parent_path() && existing != existing.parent_path())
    existing = existing.parent_path();
  if (!fs::is_directory(existing, ec))
    throw ConfigError(what + " " + path + ": " + existing.string() + " is a file, so the folder cannot be made there");
  if (!writable_folder(existing))
    throw ConfigError(what + " " + path + ": the folder " + existing.string() + " is not writable");
}

}  // namespace bs
