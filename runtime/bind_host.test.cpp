// resolve_bind_host: addresses of the node, "localhost" and interface names resolve to the
// address to bind; wildcards, foreign addresses and unknown names are errors that name the value
// and list the node's interfaces.
#include <gtest/gtest.h>

#include "troupe/runtime/bind_host.h"

using namespace troupe::runtime;

namespace {
const std::vector<std::pair<std::string, std::string>> kNode = {{"lo", "127.0.0.1"}, {"tr0", "10.251.0.2"}};

std::string error_of(const std::string& host) {
  auto r = resolve_bind_host(host, kNode);
  EXPECT_FALSE(r.ok()) << host << " resolved to " << (r.ok() ? *r : "");
  if (r.ok()) return "";
  EXPECT_EQ(r.error().code, troupe::ErrorCode::invalid_input);
  return r.error().message;
}
}  // namespace

TEST(BindHost, AddressesAndInterfaceNames) {
  EXPECT_EQ(*resolve_bind_host("127.0.0.1", kNode), "127.0.0.1");
  EXPECT_EQ(*resolve_bind_host("127.0.0.2", kNode), "127.0.0.2");  // all of 127/8 is loopback
  EXPECT_EQ(*resolve_bind_host("localhost", kNode), "127.0.0.1");
  EXPECT_EQ(*resolve_bind_host("10.251.0.2", kNode), "10.251.0.2");
  EXPECT_EQ(*resolve_bind_host("tr0", kNode), "10.251.0.2");
  EXPECT_EQ(*resolve_bind_host("lo", kNode), "127.0.0.1");
}

TEST(BindHost, ErrorsNameTheValueAndTheInterfaces) {
  for (const char* wildcard : {"0.0.0.0", "*", "::", ""}) {
    std::string e = error_of(wildcard);
    EXPECT_NE(e.find("binds every interface"), std::string::npos) << e;
    EXPECT_NE(e.find("lo 127.0.0.1, tr0 10.251.0.2"), std::string::npos) << e;
  }
  std::string e = error_of("10.251.0.1");  // the other host's address
  EXPECT_NE(e.find("'10.251.0.1' is not an address of this node"), std::string::npos) << e;
  EXPECT_NE(e.find("tr0 10.251.0.2"), std::string::npos) << e;
  e = error_of("eth7");
  EXPECT_NE(e.find("'eth7' is neither an IPv4 address nor an interface"), std::string::npos) << e;
  e = error_of("::1");  // IPv6 is not bound
  EXPECT_NE(e.find("'::1' is neither"), std::string::npos) << e;
}

TEST(BindHost, ThisNodeHasLoopback) {
  auto interfaces = ipv4_interfaces();
  bool lo = false;
  for (const auto& [name, address] : interfaces) lo = lo || address == "127.0.0.1";
  ASSERT_TRUE(lo) << "getifaddrs lists no 127.0.0.1";
  EXPECT_EQ(*resolve_bind_host("127.0.0.1"), "127.0.0.1");
}
