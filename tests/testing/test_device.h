// The device the device-aware tests run on: SPECULA_TEST_DEVICE ("cpu" when unset; "cuda",
// "cuda:N"). CI has no GPU and runs them on the CPU; on a GPU machine the same tests check the
// CUDA paths (the padded LibTorch attention, the tensor verifier, the engine end to end) against
// the same oracles. A device that is named but absent fails the test instead of skipping it.
#pragma once

#include <c10/core/Device.h>

#include <string>

namespace specula {

// The device named by SPECULA_TEST_DEVICE; aborts the test binary with a message when the name is
// malformed or the device is not usable by this LibTorch.
c10::Device TestDevice();

// TestDevice() as ModelRunnerOptions::device spells it ("cpu", "cuda:0").
std::string TestDeviceName();

}  // namespace specula
