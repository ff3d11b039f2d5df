// The rotary-embedding kernel family: cos/sin tables and the pair rotation (bodies/rope.h).
#include "bodies/rope.h"
#include "device_lanes.cuh"
#include "launchers.h"

namespace troupe::kernels::cuda {

void launch_rope_cos_sin(const Queue& q, float* cos, float* sin, const int32_t* positions, const float* inv_freq,
                         int N, int HD, float theta) {
  launch_elements(RopeCosSinBody{cos, sin, positions, inv_freq, HD, theta}, static_cast<size_t>(N) * (HD / 2),
                  q.stream);
}
void launch_rope_rotate(const Queue& q, float* out, const float* inp, const float* cos, const float* sin, float sign,
                        int N, int NH, int HD) {
  launch_elements(RopeRotateBody{out, inp, cos, sin, sign, NH, HD}, static_cast<size_t>(N) * NH * (HD / 2), q.stream);
}

}  // namespace troupe::kernels::cuda
