// Helpers shared by the fuzz targets: decoders that only read files get the input through a
// per-process scratch folder (under /dev/shm when it exists). Invariant: a path returned names a file
// holding exactly the bytes given, in a folder no other process writes.
#pragma once

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

namespace troupe::fuzz {

// The scratch folder of this process (made on first use).
inline const std::string& scratch_dir() {
  static const std::string dir = [] {
    std::error_code ec;
    std::filesystem::path base = std::filesystem::is_directory("/dev/shm", ec) ? "/dev/shm"
                                                                              : std::filesystem::temp_directory_path();
    auto d = base / ("troupe-fuzz-" + std::to_string(::getpid()));
    std::filesystem::create_directories(d);
    return d.string();
  }();
  return dir;
}

// Writes bytes to scratch_dir()/relative (folders made as needed) and returns the path.
inline std::string write_scratch(const std::string& relative, std::string_view bytes) {
  std::filesystem::path p = std::filesystem::path(scratch_dir()) / relative;
  std::filesystem::create_directories(p.parent_path());
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  return p.string();
}

inline std::string_view as_text(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

// Splits the input at the first occurrence of `sep`: {before, after} (after empty when absent).
inline std::pair<std::string_view, std::string_view> split_at(std::string_view in, std::string_view sep) {
  const size_t at = in.find(sep);
  if (at == std::string_view::npos) return {in, {}};
  return {in.substr(0, at), in.substr(at + sep.size())};
}

}  // namespace troupe::fuzz
