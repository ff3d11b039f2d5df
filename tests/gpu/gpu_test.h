// The small harness of the GPU tests (tests/gpu/): no gtest, so they build on a GPU machine that
// has only CUDA and CMake. A test is a main() that calls run_gpu_test: exit 77 (ctest: skipped)
// when no CUDA device exists, 1 when CUDA cannot start on one (cuda_probe) or a check failed, 0
// otherwise. Helpers move vectors to and from a backend's buffers and compare with atol +
// rtol*|ref| and NaN/Inf parity.
#pragma once

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "troupe/kernels/backend.h"
#include "troupe/kernels/device.h"

namespace troupe::gpu_test {

namespace k = troupe::kernels;

inline int& failures() {
  static int n = 0;
  return n;
}

#define GPU_CHECK(cond, what)                                                        \
  do {                                                                               \
    if (!(cond)) {                                                                   \
      std::printf("FAIL %s:%d: %s (%s)\n", __FILE__, __LINE__, #cond, std::string(what).c_str()); \
      ++::troupe::gpu_test::failures();                                              \
    }                                                                                \
  } while (0)

// Compares got with ref; prints the first few mismatches; returns the largest |got - ref|.
template <class T>
double expect_near(const std::string& what, const std::vector<T>& got, const std::vector<T>& ref, double atol,
                   double rtol) {
  double worst = 0;
  int bad = 0;
  if (got.size() != ref.size()) {
    std::printf("FAIL %s: %zu values, CPU op %zu\n", what.c_str(), got.size(), ref.size());
    ++failures();
    return INFINITY;
  }
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = static_cast<double>(got[i]), r = static_cast<double>(ref[i]);
    bool ok;
    if (std::isnan(r)) ok = std::isnan(g);
    else if (std::isinf(r)) ok = g == r;
    else ok = std::isfinite(g) && std::fabs(g - r) <= atol + rtol * std::fabs(r);
    if (std::isfinite(g) && std::isfinite(r)) worst = std::fmax(worst, std::fabs(g - r));
    if (!ok && bad++ < 5) std::printf("FAIL %s[%zu]: cuda %.9g, cpu %.9g\n", what.c_str(), i, g, r);
  }
  if (bad) failures() += 1;
  return worst;
}

inline std::vector<float> randn(size_t n, unsigned seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = nd(rng);
  return v;
}
inline std::vector<int32_t> randint(size_t n, int hi, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> d(0, hi - 1);
  std::vector<int32_t> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// A backend buffer holding a copy of a host vector (any trivially copyable element type).
template <class T>
struct Dev {
  k::Buffer buf;
  size_t n = 0;
  Dev(const k::Backend& be, const std::vector<T>& host) : n(host.size()) {
    auto r = be.alloc(sizeof(T) * (n ? n : 1));
    if (!r.ok()) throw std::runtime_error(r.error().message);
    buf = std::move(r.value());
    be.copy_host_to_device(buf.data(), host.data(), sizeof(T) * n);
  }
  Dev(const k::Backend& be, size_t count) : Dev(be, std::vector<T>(count)) {}
  T* p() const { return static_cast<T*>(buf.data()); }
  std::vector<T> host(const k::Backend& be) const {
    std::vector<T> v(n);
    be.copy_device_to_host(v.data(), buf.data(), sizeof(T) * n);
    return v;
  }
};

inline const k::Backend& cuda() {
  auto r = k::backend_for("cuda");
  if (!r.ok()) throw std::runtime_error(r.error().message);
  return **r;
}

inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The test's main: skipped without a device, the checks' verdict otherwise.
// A CUDA that cannot start where a GPU is (a driver older than the toolkit, ...) fails loudly.
inline int run_gpu_test(const char* name, const std::function<void()>& body, int min_devices = 1) {
  const k::CudaProbe probe = k::cuda_probe();
  if (!probe.error.empty()) {
    std::printf("FAIL %s: CUDA could not start on this machine's GPU: %s\n", name, probe.error.c_str());
    return 1;
  }
  const int devices = probe.devices;
  if (devices < min_devices) {
    std::printf("%s: %d usable CUDA device(s), needs %d: skipped\n", name, devices, min_devices);
    return 77;
  }
  const auto t0 = std::chrono::steady_clock::now();
  try {
    body();
  } catch (const std::exception& e) {
    std::printf("FAIL %s: exception: %s\n", name, e.what());
    ++failures();
  }
  std::printf("%s: %s (%d failed checks, %.2f s)\n", name, failures() ? "FAILED" : "passed", failures(),
              seconds_since(t0));
  return failures() ? 1 : 0;
}

}  // namespace troupe::gpu_test
