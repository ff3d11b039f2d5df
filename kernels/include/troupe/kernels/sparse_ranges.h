// The mapped byte ranges of a sparse buffer (Backend::mapped_ranges) from its granules' flags: one
// per run of mapped granules, ascending, the last clipped to the buffer's bytes. Shared by the
// backends' bookkeeping (cpu_fenced's page flags, cuda's granule handles: nonzero = mapped).
#pragma once

#include <algorithm>
#include <cstddef>
#include <utility>
#include <vector>

namespace troupe::kernels {

template <class Flag>
std::vector<std::pair<size_t, size_t>> mapped_granule_ranges(const std::vector<Flag>& mapped, size_t granule,
                                                             size_t bytes) {
  std::vector<std::pair<size_t, size_t>> out;
  for (size_t g = 0; g < mapped.size(); ++g) {
    if (!mapped[g]) continue;
    const size_t b = g * granule, e = std::min(bytes, b + granule);
    if (!out.empty() && out.back().second == b)
      out.back().second = e;
    else
      out.emplace_back(b, e);
  }
  return out;
}

}  // namespace troupe::kernels
