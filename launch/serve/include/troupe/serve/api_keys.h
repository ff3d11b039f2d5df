// The API keys `troupe serve` accepts (launch/serve/api_keys.cpp): read from a keys file (one key
// a line, `#` comments) or TROUPE_API_KEY, and a request's `Authorization: Bearer KEY` checked
// against every key in time that depends only on the lengths, never on where the bytes differ.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "troupe/base/result.h"

namespace troupe::serve {

// The keys of `path`: one a line, surrounding blanks trimmed; blank lines and lines starting with
// '#' skipped. An unreadable file or one without a key is an error naming the file.
Result<std::vector<std::string>> read_api_key_file(const std::string& path);

// Equal bytes, compared over the whole of both without an early exit.
bool constant_time_equal(std::string_view a, std::string_view b);

// `header` is an Authorization value "Bearer KEY" whose KEY is one of `keys` (every key is
// compared, matched or not).
bool bearer_matches(std::string_view header, const std::vector<std::string>& keys);

}  // namespace troupe::serve
