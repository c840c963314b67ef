// Precompiled header shared by every target: LibTorch dominates compile time.
#pragma once
#include <torch/torch.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>
#include <fmt/format.h>
#include <string>
#include <vector>
#include <map>
#include <optional>
#include <functional>
#include <filesystem>
