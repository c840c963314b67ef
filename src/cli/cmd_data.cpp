#include <ATen/Parallel.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <torch/torch.h>
#include <torch/version.h>

#include <chrono>
#include <fstream>
#include <iostream>

#include "cli/commands.h"
#include "core/bandwidth.h"
#include "core/runtime.h"
#include "data/prepare.h"

namespace mf::cli {
namespace {

// The BLAS library LibTorch actually loaded, read from the process's memory map.
std::string loaded_blas() {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    auto pos = line.find('/');
    if (pos == std::string::npos) continue;
    std::string path = line.substr(pos);
    if (path.find("blas") == std::string::npos && path.find("mkl") == std::string::npos) continue;
    std::error_code ec;
    auto real = std::filesystem::canonical(path, ec).string();
    std::string kind = real.find("openblas") != std::string::npos ? "OpenBLAS"
                       : real.find("mkl") != std::string::npos    ? "MKL"
                       : real.find("blis") != std::string::npos   ? "BLIS"
                       : real.find("atlas") != std::string::npos  ? "ATLAS"
                                                                  : "reference BLAS";
    return fmt::format("{} ({})", kind, ec ? path : real);
  }
  return "unknown (no BLAS library mapped)";
}

void doctor(int64_t threads) {
  if (threads > 0) set_compute_threads(static_cast<int>(threads));
  const double gflops = sgemm_gflops(2048);
  const double read = read_bandwidth_gbs();
  const std::string blas = loaded_blas();
  std::cout << fmt::format(
      "moeforge {} | LibTorch {} | threads {} | BLAS {} | sgemm 2048: {:.1f} GFLOP/s | streaming read: {:.1f} GB/s | "
      "{}\n",
      MOEFORGE_VERSION, TORCH_VERSION, at::get_num_threads(), blas, gflops, read, runtime_summary());
  if (gflops < 20)
    spdlog::warn(
        "sgemm is slow ({:.1f} GFLOP/s). Install libopenblas0-pthread so LibTorch uses OpenBLAS "
        "(Debian's reference BLAS is ~25x slower): sudo apt-get install libopenblas0-pthread",
        gflops);
}

void add_prepare(CLI::App* data) {
  auto* prep = data->add_subcommand(
      "prepare",
      "extract dictionary (dict-gcide), scripture (bible-kjv), technical (c++-annotations) and quotations "
      "(fortunes) from Debian packages, train a SentencePiece BPE tokenizer, write token shards and "
      "manifest.json into data.dir. Skips work when its inputs are unchanged.");
  static std::string cfg_path;
  static std::vector<std::string> sets;
  static bool force = false;
  prep->add_option("config", cfg_path, "TOML config (only its [data] table is used); defaults apply without one")
      ->check(CLI::ExistingFile);
  add_set_option(prep, sets);
  prep->add_flag("--force", force, "rebuild even if the manifest says the data is up to date");
  prep->callback([] {
    auto cfg = resolve_config(cfg_path, sets);
    auto r = prepare_corpus(cfg.data, force);
    std::cout << fmt::format("{:<12} {:>10} {:>12} {:>10} {:>10} {:>9}\n", "domain", "documents", "train tok",
                             "val tok", "test tok", "H1 nats");
    for (auto& d : r.manifest["domains"])
      std::cout << fmt::format("{:<12} {:>10} {:>12} {:>10} {:>10} {:>9.3f}\n", d["name"].get<std::string>(),
                               d["documents"].get<int64_t>(), d["splits"]["train"]["tokens"].get<int64_t>(),
                               d["splits"]["val"]["tokens"].get<int64_t>(),
                               d["splits"]["test"]["tokens"].get<int64_t>(), d["unigram_entropy_nats"].get<double>());
    std::cout << fmt::format("unigram entropy of the training tokens: {:.3f} nats; data in {}{}\n",
                             r.manifest["unigram_entropy_nats"].get<double>(), cfg.data.dir,
                             r.skipped ? " (unchanged)" : "");
  });
}

void add_doctor(CLI::App& app) {
  auto* doc = app.add_subcommand(
      "doctor", "print LibTorch version, threads, the BLAS in use, measured sgemm GFLOP/s and streaming-read GB/s");
  static int64_t threads = 0;
  doc->add_option("--threads", threads, "intra-op threads to measure with (0 = the cores, as train.threads = 0)");
  doc->callback([] { doctor(threads); });
}

}  // namespace

void register_data_commands(CLI::App& app) {
  auto* data = app.add_subcommand("data", "prepare the built-in multi-domain corpus");
  data->require_subcommand(1);
  add_prepare(data);
  add_doctor(app);
}

}  // namespace mf::cli
