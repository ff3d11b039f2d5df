// kernels.cuda_host_decisions (activation offload bounds): an input larger than its layer's slot
// is an error naming the layer and both sizes, never a truncated copy.
#include <gtest/gtest.h>

#include <cstddef>
#include <string>

#include "offload_bounds.h"

namespace troupe::kernels::cuda {
namespace {

TEST(CudaOffload, InputLargerThanItsSlotIsAnErrorNotATruncation) {
  EXPECT_EQ(*offload_floats(0, 100, 100), 100u);
  EXPECT_EQ(*offload_floats(0, 10, 100), 10u);
  EXPECT_EQ(*offload_floats(0, static_cast<size_t>(-1), 100), 100u);  // the default: the whole slot
  const auto r = offload_floats(3, 101, 100);
  ASSERT_FALSE(r.ok());
  const std::string m = r.error().message;
  EXPECT_NE(m.find("layer 3's input is 101 floats, more than its slot of 100 floats"), std::string::npos)
      << m;
}

}  // namespace
}  // namespace troupe::kernels::cuda
