// resolve_bind_host: a rank's tcp bind address from an address or an interface name of its node.
#include "troupe/runtime/bind_host.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>

namespace troupe::runtime {

std::vector<std::pair<std::string, std::string>> ipv4_interfaces() {
  std::vector<std::pair<std::string, std::string>> out;
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return out;
  for (ifaddrs* a = list; a != nullptr; a = a->ifa_next) {
    if (a->ifa_addr == nullptr || a->ifa_addr->sa_family != AF_INET) continue;
    char text[INET_ADDRSTRLEN] = {};
    const auto* in = reinterpret_cast<const sockaddr_in*>(a->ifa_addr);
    if (::inet_ntop(AF_INET, &in->sin_addr, text, sizeof text) != nullptr)
      out.emplace_back(a->ifa_name, text);
  }
  ::freeifaddrs(list);
  return out;
}

bool is_wildcard_bind_host(const std::string& host) {
  return host.empty() || host == "*" || host == "0.0.0.0" || host == "::" || host == "[::]";
}

Result<std::string> resolve_bind_host(const std::string& host) {
  return resolve_bind_host(host, ipv4_interfaces());
}

Result<std::string> resolve_bind_host(const std::string& host,
                                      const std::vector<std::pair<std::string, std::string>>& interfaces) {
  std::string listed;
  for (const auto& [name, address] : interfaces)
    listed += (listed.empty() ? "" : ", ") + name + " " + address;
  const std::string these =
      " (this node's interfaces: " + (listed.empty() ? std::string("none with IPv4") : listed) + ")";
  if (is_wildcard_bind_host(host))
    return invalid_input(
        "'" + host +
        "' binds every interface but gives peers no address to reach this rank: name this node's "
        "interface (e.g. eth0, the same name on every node) or one of its addresses" +
        these);
  if (host == "localhost") return std::string("127.0.0.1");
  in_addr parsed{};
  if (::inet_pton(AF_INET, host.c_str(), &parsed) == 1) {
    if ((ntohl(parsed.s_addr) >> 24) == 127) return host;  // 127.0.0.0/8 is this node's loopback
    for (const auto& [name, address] : interfaces)
      if (address == host) return host;
    return invalid_input("'" + host + "' is not an address of this node" + these +
                         "; with hosts of different addresses, name the interface instead");
  }
  for (const auto& [name, address] : interfaces)
    if (name == host) return address;  // its first IPv4 address
  return invalid_input("'" + host + "' is neither an IPv4 address nor an interface (with one) of this node" +
                       these);
}

}  // namespace troupe::runtime
