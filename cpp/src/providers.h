// The options model.cpp gives ONNX Runtime's execution providers, as data: the unit tests read what a GPU
// session gets on a machine without one. Internal header.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace twostep::detail {

// The keys and values given to OrtCUDAProviderOptionsV2 (UpdateCUDAProviderOptions) for provider "cuda":
// device 0, and TF32 off: the provider runs fp32 MatMuls on TF32 tensor cores by default, ~1e-3 off the fp32
// the artifact was validated in (the Python ort-cuda backend sets the same).
std::vector<std::pair<std::string, std::string>> cuda_provider_options();

}  // namespace twostep::detail
