// The dtype the generators hold their weights in (YAML weight_sync.dtype): the learner's fp32
// master as it is, or rounded to bf16. Its value travels in Weights messages (int32).
#pragma once

#include <cstdint>
#include <string_view>
#include <utility>

#include "troupe/base/enum_names.h"

namespace troupe::actors {
enum class WeightDtype : std::int32_t { fp32 = 0, bf16 = 1 };
}  // namespace troupe::actors

namespace troupe {
template <>
struct EnumNames<actors::WeightDtype> {
  static constexpr std::pair<std::string_view, actors::WeightDtype> table[] = {{"fp32", actors::WeightDtype::fp32},
                                                                               {"bf16", actors::WeightDtype::bf16}};
};
}  // namespace troupe
