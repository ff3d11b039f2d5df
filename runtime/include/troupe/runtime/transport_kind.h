// How ranks reach each other under mpirun/srun (YAML cluster.transport): ipc sockets on one host,
// or tcp across hosts. One process always uses inproc and never reads this.
#pragma once

#include <string_view>
#include <utility>

#include "troupe/base/enum_names.h"

namespace troupe::runtime {
enum class TransportKind { ipc, tcp };
}  // namespace troupe::runtime

namespace troupe {
template <>
struct EnumNames<runtime::TransportKind> {
  static constexpr std::pair<std::string_view, runtime::TransportKind> table[] = {{"ipc", runtime::TransportKind::ipc},
                                                                                  {"tcp", runtime::TransportKind::tcp}};
};
}  // namespace troupe
