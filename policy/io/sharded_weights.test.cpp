// policy.sharded_weights: shards.json and the per-rank files of a sharded checkpoint written and read
// back (whole and by range across file edges, an empty shard; ShardRangeReader's ranges alone, hashing
// the files it opens or not); every malformed manifest key, a corrupt, truncated or missing file
// (named with its rank) and a table of another model refused.
#include "troupe/policy/io/sharded_weights.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <span>
#include <vector>

#include <nlohmann/json.hpp>

#include "test_temp_dir.h"

namespace fs = std::filesystem;
using namespace troupe::policy;
using namespace troupe::policy::io;
using nlohmann::json;

namespace {

// 3 ranks over 40 values: [0, 16), [16, 32), [32, 40); params = i, exp_avg = -i.
ShardManifest write_three(const fs::path& dir, size_t n = 40, std::vector<size_t> bounds = {0, 16, 32, 40}) {
  ShardManifest m;
  m.stage = "parameters";
  m.world_size = static_cast<int>(bounds.size()) - 1;
  m.bounds = bounds;
  m.buffers = {kShardParams, "exp_avg"};
  m.tensors = {TensorSpec{"a.weight", {4, 5}, 0}, TensorSpec{"b.weight", {20}, 20}};
  std::vector<float> p(n), q(n);
  for (size_t i = 0; i < n; ++i) p[i] = static_cast<float>(i), q[i] = -static_cast<float>(i);
  for (int r = 0; r < m.world_size; ++r) {
    const size_t lo = bounds[static_cast<size_t>(r)], hi = bounds[static_cast<size_t>(r) + 1];
    auto f = write_shard_file(dir.string(), r, m.world_size, lo, hi,
                              {{kShardParams, std::span<const float>(p).subspan(lo, hi - lo)},
                               {"exp_avg", std::span<const float>(q).subspan(lo, hi - lo)}});
    EXPECT_TRUE(f.ok()) << f.error().message;
    m.files.push_back(*f);
  }
  EXPECT_TRUE(write_shard_manifest(dir.string(), m).ok());
  return m;
}

std::string error_of(const fs::path& dir) {
  auto m = read_shard_manifest(dir.string());
  return m.ok() ? std::string("ok") : m.error().message;
}

void edit(const fs::path& dir, const std::function<void(json&)>& change) {
  const fs::path p = dir / kShardManifestFile;
  std::ifstream in(p);
  json j = json::parse(in);
  change(j);
  std::ofstream(p) << j.dump();
}

}  // namespace

TEST(ShardedWeights, RoundTripWholeAndRanges) {
  const auto dir = troupe::policy::io::testing::make_temp_dir("sharded_weights", "round_trip");
  write_three(dir);
  ASSERT_TRUE(has_shard_manifest(dir.string()));
  auto m = read_shard_manifest(dir.string());
  ASSERT_TRUE(m.ok()) << m.error().message;
  EXPECT_EQ(m->world_size, 3);
  EXPECT_EQ(m->numel(), 40u);
  ASSERT_TRUE(verify_shard_files(dir.string(), *m).ok());
  auto part = read_shard_buffer(dir.string(), *m, "exp_avg", 10, 35);  // across both file edges
  ASSERT_TRUE(part.ok()) << part.error().message;
  for (size_t i = 0; i < part->size(); ++i) EXPECT_EQ((*part)[i], -static_cast<float>(10 + i));
  auto t = read_sharded_tensors(dir.string(), *m);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->at("b.weight").data.front(), 20.0f);
  EXPECT_EQ(t->at("a.weight").shape, (std::vector<int64_t>{4, 5}));
  EXPECT_TRUE(check_shard_table(*m, m->tensors, "the model").ok());
  std::vector<TensorSpec> other = m->tensors;
  other[1].shape = {10, 2};
  const auto bad = check_shard_table(*m, other, "the model");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("b.weight (20,) at offset 20, but the model has b.weight (10, 2)"), std::string::npos) << bad.error().message;
  EXPECT_NE(bad.error().message.find("another model"), std::string::npos);
}

TEST(ShardedWeights, EmptyShard) {  // a rank past the end of a small buffer holds nothing
  const auto dir = troupe::policy::io::testing::make_temp_dir("sharded_weights", "empty");
  write_three(dir, 40, {0, 32, 40, 40});
  auto m = read_shard_manifest(dir.string());
  ASSERT_TRUE(m.ok()) << m.error().message;
  auto all = read_shard_buffer(dir.string(), *m, kShardParams, 0, 40);
  ASSERT_TRUE(all.ok()) << all.error().message;
  EXPECT_EQ(all->back(), 39.0f);
}

TEST(ShardedWeights, BadFilesNameTheRank) {
  const auto dir = troupe::policy::io::testing::make_temp_dir("sharded_weights", "bad_files");
  write_three(dir);
  auto m = read_shard_manifest(dir.string());
  ASSERT_TRUE(m.ok());
  {  // one byte changed
    std::fstream f(dir / "shards/rank_1.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-2, std::ios::end);
    f.put('\x55');
  }
  auto e = verify_shard_files(dir.string(), *m);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.error().message.find("rank_1.safetensors (rank 1 of 3) fails its checksum"), std::string::npos) << e.error().message;
  fs::resize_file(dir / "shards/rank_2.safetensors", 10);
  auto r = read_shard_buffer(dir.string(), *m, kShardParams, 33, 34);  // only rank 2's file is read
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("(rank 2 of 3) has 10 bytes"), std::string::npos) << r.error().message;
  fs::remove(dir / "shards/rank_0.safetensors");
  e = verify_shard_files(dir.string(), *m);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.error().message.find("(rank 0 of 3) is missing"), std::string::npos) << e.error().message;
}

TEST(ShardedWeights, RangeReaderReadsTheRangesAlone) {
  const auto dir = troupe::policy::io::testing::make_temp_dir("sharded_weights", "range_reader");
  write_three(dir);
  auto m = read_shard_manifest(dir.string());
  ASSERT_TRUE(m.ok());
  {  // one byte of rank 1's file changed: a reader that hashes refuses it, one that does not reads the ranges
    std::fstream f(dir / "shards/rank_1.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-2, std::ios::end);
    f.put('\x55');
  }
  fs::remove(dir / "shards/rank_0.safetensors");  // (no range below touches it: never opened)
  ShardRangeReader trusting(dir.string(), *m, false);
  std::vector<float> out(15);
  const uint64_t before = safetensors_data_bytes_read();
  ASSERT_TRUE(trusting.read("exp_avg", 20, out).ok());  // across rank 1's and rank 2's files
  ASSERT_TRUE(trusting.read(kShardParams, 20, std::span<float>(out).first(5)).ok());
  EXPECT_EQ(safetensors_data_bytes_read() - before, (15u + 5u) * 4u);
  for (size_t i = 0; i < 5; ++i) EXPECT_EQ(out[i], static_cast<float>(20 + i));
  for (size_t i = 5; i < out.size(); ++i) EXPECT_EQ(out[i], -static_cast<float>(20 + i));
  ShardRangeReader hashing(dir.string(), *m, true);
  auto e = hashing.read(kShardParams, 20, out);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.error().message.find("rank_1.safetensors (rank 1 of 3) fails its checksum"), std::string::npos) << e.error().message;
  e = trusting.read(kShardParams, 0, out);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.error().message.find("(rank 0 of 3) is missing"), std::string::npos) << e.error().message;
  e = trusting.read(kShardParams, 30, out);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.error().message.find("asked for values [30, 45) of a buffer of 40"), std::string::npos) << e.error().message;
}

TEST(ShardedWeights, BadManifestNamesTheKey) {
  const auto dir = troupe::policy::io::testing::make_temp_dir("sharded_weights", "bad_manifest");
  write_three(dir);
  const std::pair<std::function<void(json&)>, std::string> cases[] = {
      {[](json& j) { j["format"] = "x"; }, "'format'"},
      {[](json& j) { j["kind"] = "x"; }, "'kind'"},
      {[](json& j) { j["world_size"] = -1; }, "'world_size'"},
      {[](json& j) { j["bounds"] = json::array({0, 16, 8, 40}); }, "'bounds'"},
      {[](json& j) { j["bounds"] = json::array({0, 40}); }, "'bounds'"},
      {[](json& j) { j["tensors"][1]["offset"] = 39; }, "tensor 'b.weight' lies outside"},
      {[](json& j) { j["tensors"][0].erase("shape"); }, "'shape'"},
      {[](json& j) { j["files"].erase(2); }, "'files'"},
      {[](json& j) { j["files"][1]["begin"] = 17; }, "rank 1"},
      {[](json& j) { j["files"][1]["path"] = "../x"; }, "not a path inside"},
      {[](json& j) { j["files"][1]["xxh3"] = "zz"; }, "'xxh3'"},
  };
  const std::string good = [&] {
    std::ifstream in(dir / kShardManifestFile);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }();
  for (const auto& [change, want] : cases) {
    std::ofstream(dir / kShardManifestFile) << good;
    edit(dir, change);
    const std::string e = error_of(dir);
    EXPECT_NE(e.find("shards.json"), std::string::npos) << e;
    EXPECT_NE(e.find(want), std::string::npos) << "wanted " << want << " in: " << e;
  }
  std::ofstream(dir / kShardManifestFile) << "{not json";
  EXPECT_NE(error_of(dir).find("not a JSON object"), std::string::npos);
}
