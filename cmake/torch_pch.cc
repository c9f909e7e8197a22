// The translation unit that builds the precompiled <torch/torch.h> (cmake/TorchPch.cmake).
