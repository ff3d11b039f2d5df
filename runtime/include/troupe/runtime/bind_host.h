// The tcp address a rank binds and gives its peers, resolved on the rank's own node: an IPv4
// address of one of its interfaces, "localhost", or an interface name (eth0, ib0: the same name
// on every node, so one config serves hosts whose addresses differ). A wildcard (0.0.0.0, *)
// binds every interface but names none a peer could reach, so it is refused.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "troupe/base/result.h"

namespace troupe::runtime {

// (interface name, IPv4 address) of every interface of this node that has one, as getifaddrs lists them.
std::vector<std::pair<std::string, std::string>> ipv4_interfaces();

// "", "*", "0.0.0.0", "::", "[::]": every interface, none a peer could reach (refused).
bool is_wildcard_bind_host(const std::string& host);

// `host` as the IPv4 address to bind; an error (invalid_input, "'HOST' is ...") names the value
// and lists this node's interfaces with their addresses. `interfaces` defaults to ipv4_interfaces().
Result<std::string> resolve_bind_host(const std::string& host);
Result<std::string> resolve_bind_host(const std::string& host,
                                      const std::vector<std::pair<std::string, std::string>>& interfaces);

}  // namespace troupe::runtime
