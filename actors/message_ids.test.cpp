// actors.message_ids: every message type troupe links has its id from the one table
// (troupe/base/message_ids.h); two types claiming one id are refused at registration, by name;
// no source file outside the tests spells a type id as a bare number; and docs/architecture.md
// says where the ids live.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include "troupe/actors/messages.h"
#include "troupe/base/build_config.h"
#include "troupe/base/message_ids.h"
#include "troupe/runtime/system.h"

namespace troupe::actors {
namespace {

namespace fs = std::filesystem;

bool in_table(std::uint32_t id) {
  for (const auto& e : message_id::kTable)
    if (e.id == id) return true;
  return false;
}

template <class... M>
void expect_table_ids_distinct(MessageList<M...>) {
  std::set<std::uint32_t> seen;
  (
      [&] {
        EXPECT_TRUE(in_table(M::type_id)) << M::type_name << " has id " << M::type_id << ", which is not in the table";
        EXPECT_TRUE(seen.insert(M::type_id).second) << M::type_name << " shares id " << M::type_id << " with another type";
      }(),
      ...);
}

TEST(MessageIds, EveryRoleMessageHasItsOwnTableId) { expect_table_ids_distinct(RoleMessages{}); }

TEST(MessageIds, EveryLinkedTypeRegisters) {
  Status st = register_messages();
  EXPECT_TRUE(st.ok()) << st.error().message;
}

struct ClaimsWeightsId {  // a type that takes an id already taken: registration must refuse it
  static constexpr std::uint32_t type_id = message_id::weights;
  static constexpr const char* type_name = "test.ClaimsWeightsId";
  template <class A>
  void serialize(A&) {}
};

TEST(MessageIds, ASecondClaimOnAnIdIsAnErrorNamingBoth) {
  ASSERT_TRUE(runtime::register_message<Weights>().ok());
  const Status& st = runtime::register_message<ClaimsWeightsId>();
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.error().message.find("actors.Weights"), std::string::npos) << st.error().message;
  EXPECT_NE(st.error().message.find("test.ClaimsWeightsId"), std::string::npos) << st.error().message;
}

TEST(MessageIds, ASendOfAnUnregistrableTypeFails) {
  runtime::SystemConfig sc;
  sc.threads = 1;
  auto sys = runtime::ActorSystem::create(sc);
  ASSERT_TRUE(sys.ok()) << sys.error().message;
  ASSERT_TRUE(runtime::register_message<Weights>().ok());
  Status st = (*sys)->send(runtime::ActorId{0, 1}, ClaimsWeightsId{});
  EXPECT_FALSE(st.ok());
}

// Outside the tests, a message's type_id names a table entry: `type_id = 2012` anywhere in the
// sources would be an id the table does not know about.
TEST(MessageIds, NoBareTypeIdInTheSources) {
  const std::regex bare(R"(constexpr[^;]*\btype_id\s*=\s*[0-9])");
  int files = 0;
  for (const auto& folder : {"runtime", "actors", "launch", "envs", "policy", "learner", "kernels"}) {
    for (auto it = fs::recursive_directory_iterator(fs::path(TROUPE_SOURCE_DIR) / folder);
         it != fs::recursive_directory_iterator(); ++it) {
      const fs::path& p = it->path();
      const std::string name = p.filename().string();
      if (!it->is_regular_file() || name.find(".test.") != std::string::npos || name == "test_messages.h") continue;
      if (p.extension() != ".h" && p.extension() != ".cpp") continue;
      std::ifstream in(p);
      std::stringstream text;
      text << in.rdbuf();
      ++files;
      EXPECT_FALSE(std::regex_search(text.str(), bare)) << p << " spells a message type id as a bare number";
    }
  }
  EXPECT_GT(files, 50);
}

TEST(MessageIds, ArchitectureDocNamesTheTable) {
  std::ifstream in(fs::path(TROUPE_SOURCE_DIR) / "docs/architecture.md");
  ASSERT_TRUE(in) << "cannot read docs/architecture.md";
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_NE(text.str().find("include/troupe/base/message_ids.h"), std::string::npos)
      << "docs/architecture.md must say that every message id is in include/troupe/base/message_ids.h";
}

}  // namespace
}  // namespace troupe::actors
