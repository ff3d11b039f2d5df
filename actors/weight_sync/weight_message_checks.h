// Test-only checks shared by the weight sync tests that compare a joined message with the one a
// single encoder sends (actors.weight_shards, actors.expert_sync), and messages the weight sync
// tests expect to be alike (actors.weight_sync).
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <span>

#include "troupe/actors/messages.h"

namespace troupe::actors::sync_checks {

inline bool same_bits(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size_bytes()) == 0;
}

// Every field the generators read, the payload's bytes included.
inline void expect_same_message(const Weights& a, const Weights& b) {
  EXPECT_EQ(a.version, b.version);
  EXPECT_EQ(a.base_version, b.base_version);
  EXPECT_EQ(a.encoding, b.encoding);
  EXPECT_EQ(a.elements, b.elements);
  EXPECT_EQ(a.chunk_elements, b.chunk_elements);
  EXPECT_EQ(a.chunk_starts, b.chunk_starts);
  EXPECT_EQ(a.chunk_bytes, b.chunk_bytes);
  EXPECT_EQ(a.chunk_format, b.chunk_format);
  EXPECT_EQ(a.checksums, b.checksums);
  EXPECT_EQ(a.changed, b.changed);
  EXPECT_TRUE(a.payload.str() == b.payload.str());
}

}  // namespace troupe::actors::sync_checks
