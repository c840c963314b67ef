// Precompiled header shared by every target: LibTorch dominates compile time.
#pragma once
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <torch/torch.h>
#include <filesystem>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>
