#include "tests/testing/test_device.h"

#include <torch/cuda.h>

#include <cstdio>
#include <cstdlib>

namespace specula {

c10::Device TestDevice() {
  static const c10::Device device = [] {
    const char* name = std::getenv("SPECULA_TEST_DEVICE");
    const std::string spelled = name == nullptr || *name == '\0' ? "cpu" : name;
    try {
      c10::Device d(spelled);
      if (d.is_cuda() && !torch::cuda::is_available()) {
        std::fprintf(stderr, "SPECULA_TEST_DEVICE=%s but this LibTorch sees no CUDA device\n",
                     spelled.c_str());
        std::exit(2);
      }
      return d;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "SPECULA_TEST_DEVICE=%s is not a device (cpu, cuda, cuda:N)\n",
                   spelled.c_str());
      std::exit(2);
    }
  }();
  return device;
}

std::string TestDeviceName() { return TestDevice().str(); }

}  // namespace specula
