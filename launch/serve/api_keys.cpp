// API keys of `troupe serve` (api_keys.h): the keys file, and the constant-time check of a
// request's bearer token. A key never appears in an error message.
#include "troupe/serve/api_keys.h"

#include <cctype>
#include <fstream>

namespace troupe::serve {

Result<std::vector<std::string>> read_api_key_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) return invalid_input("--api-key-file " + path + ": cannot read the file");
  std::vector<std::string> keys;
  std::string line;
  while (std::getline(in, line)) {
    const size_t b = line.find_first_not_of(" \t\r");
    if (b == std::string::npos || line[b] == '#') continue;
    const size_t e = line.find_last_not_of(" \t\r");
    keys.push_back(line.substr(b, e - b + 1));
  }
  if (in.bad()) return invalid_input("--api-key-file " + path + ": cannot read the file");
  if (keys.empty()) return invalid_input("--api-key-file " + path + ": the file has no key (one key a line, # comments)");
  return keys;
}

bool constant_time_equal(std::string_view a, std::string_view b) {
  // Every byte of the longer one is read; a length mismatch is folded into the same accumulator.
  const size_t n = a.size() > b.size() ? a.size() : b.size();
  volatile unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff = static_cast<unsigned char>(diff | (x ^ y));
  }
  return diff == 0;
}

bool bearer_matches(std::string_view header, const std::vector<std::string>& keys) {
  static constexpr std::string_view kBearer = "bearer ";  // the scheme is case-insensitive (RFC 7235)
  if (header.size() < kBearer.size()) return false;
  for (size_t i = 0; i < kBearer.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(header[i])) != kBearer[i]) return false;
  std::string_view token = header.substr(kBearer.size());
  while (!token.empty() && (token.back() == ' ' || token.back() == '\t')) token.remove_suffix(1);
  bool any = false;
  for (const auto& k : keys) any = constant_time_equal(token, k) || any;  // no short-circuit past a match
  return any;
}

}  // namespace troupe::serve
