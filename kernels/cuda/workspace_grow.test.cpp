// kernels.cuda_host_decisions (workspace growth): a failed grow of the CUDA backend's scratch
// leaves an empty, usable workspace and an error naming it, the bytes asked for and what it held.
#include <gtest/gtest.h>

#include <cstdlib>
#include <stdexcept>
#include <string>

#include "workspace_grow.h"

namespace troupe::kernels::cuda {
namespace {

struct FakeMemory {
  size_t limit = 1 << 20;  // the largest block the "device" gives
  int live = 0;            // blocks allocated and not released
  WorkspaceMemory mem() {
    return {[this](size_t n) -> void* {
              if (n > limit)
                throw std::runtime_error("out of memory asking for " + std::to_string(n) + " bytes");
              ++live;
              return std::malloc(n);
            },
            [this](void* p) {
              --live;
              std::free(p);
            }};
  }
};

TEST(CudaWorkspace, GrowsAndReusesWithinItsSize) {
  FakeMemory fake;
  void* data = nullptr;
  size_t bytes = 0;
  ASSERT_TRUE(grow_workspace("ops scratch", data, bytes, 256, fake.mem()).ok());
  EXPECT_NE(data, nullptr);
  EXPECT_EQ(bytes, 256u);
  void* first = data;
  ASSERT_TRUE(grow_workspace("ops scratch", data, bytes, 100, fake.mem()).ok());
  EXPECT_EQ(data, first);  // smaller: the same block
  ASSERT_TRUE(grow_workspace("ops scratch", data, bytes, 4096, fake.mem()).ok());
  EXPECT_EQ(bytes, 4096u);
  EXPECT_EQ(fake.live, 1);
  fake.mem().release(data);
}

TEST(CudaWorkspace, OutOfMemoryLeavesAnEmptyUsableWorkspaceAndNamesTheBytes) {
  FakeMemory fake;
  void* data = nullptr;
  size_t bytes = 0;
  ASSERT_TRUE(grow_workspace("ops scratch", data, bytes, 1024, fake.mem()).ok());
  const Status st = grow_workspace("ops scratch", data, bytes, 2u << 20, fake.mem());
  ASSERT_FALSE(st.ok());
  const std::string m = st.error().message;
  EXPECT_NE(m.find("workspace 'ops scratch'"), std::string::npos) << m;
  EXPECT_NE(m.find("to 2097152 bytes"), std::string::npos) << m;
  EXPECT_NE(m.find("it held 1024 bytes, now 0 are allocated"), std::string::npos) << m;
  EXPECT_NE(m.find("out of memory asking for 2097152 bytes"), std::string::npos) << m;
  // Never a null workspace that claims a size: the next (smaller) ask allocates again.
  EXPECT_EQ(data, nullptr);
  EXPECT_EQ(bytes, 0u);
  EXPECT_EQ(fake.live, 0);
  ASSERT_TRUE(grow_workspace("ops scratch", data, bytes, 512, fake.mem()).ok());
  EXPECT_NE(data, nullptr);
  EXPECT_EQ(bytes, 512u);
  fake.mem().release(data);
}

TEST(CudaWorkspace, AllocatorReturningNullIsAnErrorToo) {
  void* data = nullptr;
  size_t bytes = 0;
  const WorkspaceMemory null_mem{[](size_t) -> void* { return nullptr; }, [](void*) {}};
  const Status st = grow_workspace("ops scratch", data, bytes, 64, null_mem);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.error().message.find("the allocator returned no memory"), std::string::npos)
      << st.error().message;
  EXPECT_EQ(bytes, 0u);
}

}  // namespace
}  // namespace troupe::kernels::cuda
