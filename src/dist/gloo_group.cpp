#include "dist/gloo_group.h"

#include <c10/util/Exception.h>
#include <fmt/format.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <fmt/ranges.h>

#include <chrono>
#include <map>
#include <optional>
#include <thread>

namespace mf {
namespace {

// The tensors side by side in one buffer (a bucket), and the buffer's values back into them.
at::Tensor flatten(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> flat;
  for (auto& t : tensors) flat.push_back(t.reshape({-1}));
  return at::cat(flat);
}
void unflatten(const at::Tensor& bucket, std::vector<at::Tensor>& tensors) {
  int64_t at = 0;
  for (auto& t : tensors) {
    t.copy_(bucket.narrow(0, at, t.numel()).view(t.sizes()));
    at += t.numel();
  }
}

// Every rank checks in under its own key. The second worker with one RANK is refused, and tells
// the others, which stop at once instead of waiting for a rank that never comes.
void roll_call(c10d::Store& store, const WorldEnv& env) {
  const auto key = [](int r) { return fmt::format("moeforge/rank{}", r); };
  const std::string abort_key = "moeforge/abort";
  if (store.add(key(env.rank), 1) > 1) {
    const auto why = fmt::format("two workers were started with RANK={} (WORLD_SIZE = {})", env.rank, env.world);
    store.set(abort_key, std::vector<uint8_t>(why.begin(), why.end()));
    throw std::runtime_error(why);
  }
  std::vector<std::string> all;
  for (int r = 0; r < env.world; ++r) all.push_back(key(r));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(env.timeout_s);
  for (;;) {
    std::vector<int> missing;
    std::optional<std::string> abort;
    const bool late = std::chrono::steady_clock::now() > deadline;
    try {
      if (store.check({abort_key})) {
        const auto why = store.get(abort_key);
        abort = std::string(why.begin(), why.end());
      } else if (store.check(all)) {  // one round trip; who is missing is asked only at the deadline
        return;
      } else if (late) {
        for (int r = 0; r < env.world; ++r)
          if (!store.check({key(r)})) missing.push_back(r);
      }
    } catch (const std::exception& e) {  // rank 0, which holds the store, has gone
      throw std::runtime_error(
          fmt::format("rank {} of {}: the rendezvous at {}:{} closed while waiting for the other "
                      "ranks ({}); rank 0 stopped, see its error",
                      env.rank, env.world, env.master_addr, env.master_port, e.what()));
    }
    if (abort) {
      if (env.rank == 0) std::this_thread::sleep_for(std::chrono::seconds(1));  // the others read it from our store
      throw std::runtime_error(fmt::format("rank {} stops: {}", env.rank, *abort));
    }
    if (late && !missing.empty())
      throw std::runtime_error(fmt::format(
          "rank {} of {}: rank(s) {} did not join within {} s (MOEFORGE_DIST_TIMEOUT); were they started, with the "
          "same MASTER_ADDR:MASTER_PORT = {}:{}?",
          env.rank, env.world, fmt::join(missing, ", "), env.timeout_s, env.master_addr, env.master_port));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

class GlooGroup : public DataParallel {
 public:
  GlooGroup(const WorldEnv& env) : env_(env) {
    const std::chrono::milliseconds timeout = std::chrono::seconds(env.timeout_s);
    c10d::TCPStoreOptions so;
    so.port = static_cast<std::uint16_t>(env.master_port);
    so.isServer = env.rank == 0;
    so.numWorkers = static_cast<std::size_t>(env.world);
    so.waitWorkers = false;  // roll_call waits instead, naming who is missing
    so.timeout = timeout;
    try {
      store_ = c10::make_intrusive<c10d::TCPStore>(env.master_addr, so);
    } catch (const c10::Error& e) {
      throw unjoined(e.what_without_backtrace());
    } catch (const std::exception& e) {  // c10d's socket errors
      throw unjoined(e.what());
    }
    roll_call(*store_, env);
    try {
      auto opts = c10d::ProcessGroupGloo::Options::create();
      const bool loopback = env.master_addr == "localhost" || env.master_addr.rfind("127.", 0) == 0;
      opts->devices.push_back(loopback ? c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1")
                                       : c10d::ProcessGroupGloo::createDefaultDevice());
      opts->timeout = timeout;
      pg_ = c10::make_intrusive<c10d::ProcessGroupGloo>(store_, env.rank, env.world, opts);
      // the channel of start_sum: its collectives are ordered apart from pg_'s
      async_pg_ = c10::make_intrusive<c10d::ProcessGroupGloo>(c10::make_intrusive<c10d::PrefixStore>("sums", store_),
                                                              env.rank, env.world, opts);
    } catch (const c10::Error& e) {
      throw unjoined(e.what_without_backtrace());
    } catch (const std::exception& e) {  // c10d's socket errors
      throw unjoined(e.what());
    }
  }
  int rank() const override { return env_.rank; }
  int world() const override { return env_.world; }

  void sum(std::vector<at::Tensor>& tensors) override {
    at::NoGradGuard no_grad;
    // One all-reduce per dtype over the tensors flattened into one buffer (the gradient bucket).
    std::map<at::ScalarType, std::vector<size_t>> by_type;
    for (size_t i = 0; i < tensors.size(); ++i)
      if (tensors[i].defined()) by_type[tensors[i].scalar_type()].push_back(i);
    for (auto& [type, index] : by_type) {
      std::vector<at::Tensor> same;
      for (auto i : index) same.push_back(tensors[i]);
      std::vector<at::Tensor> bucket = {flatten(same)};
      run([&] { return pg_->allreduce(bucket); });
      unflatten(bucket[0], same);  // the same tensors as in `tensors`: summed in place
    }
  }
  void start_sum(std::vector<at::Tensor> tensors) override {
    at::NoGradGuard no_grad;
    Pending p;
    if (tensors.size() == 1 && tensors[0].is_contiguous()) {  // summed in place (a gradient bucket)
      p.bucket = {tensors[0].view({-1})};
    } else {
      p.bucket = {flatten(tensors)};
      p.tensors = std::move(tensors);
    }
    try {
      p.work = async_pg_->allreduce(p.bucket);
    } catch (const c10::Error& e) {
      throw lost(e.what_without_backtrace());
    }
    pending_.push_back(std::move(p));
  }
  void finish_sums() override {
    at::NoGradGuard no_grad;
    for (auto& p : pending_) {
      run([&] { return p.work; });
      unflatten(p.bucket[0], p.tensors);
    }
    pending_.clear();
  }
  void broadcast(std::vector<at::Tensor>& tensors) override {
    at::NoGradGuard no_grad;
    for (auto& t : tensors) {
      std::vector<at::Tensor> one = {t};
      run([&] { return pg_->broadcast(one); });
      t.unsafeGetTensorImpl()->bump_version();  // written in place by Gloo: caches keyed on the version see it
    }
  }
  void all_to_all(at::Tensor& out, at::Tensor& in, std::vector<int64_t> out_rows,
                  std::vector<int64_t> in_rows) override {
    run([&] { return pg_->alltoall_base(out, in, out_rows, in_rows); });
  }
  void barrier() override {
    run([&] { return pg_->barrier(); });
  }
  double take_comm_seconds() override {
    const double s = comm_s_;
    comm_s_ = 0;
    return s;
  }

 private:
  template <class Start>
  void run(Start start) {
    const auto t0 = std::chrono::steady_clock::now();
    try {
      start()->wait();
    } catch (const c10::Error& e) {
      throw lost(e.what_without_backtrace());
    } catch (const std::exception& e) {  // Gloo's own IoException
      throw lost(e.what());
    }
    comm_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }

  std::runtime_error unjoined(const std::string& why) const {
    return std::runtime_error(fmt::format(
        "rank {} of {}: could not join the group at MASTER_ADDR:MASTER_PORT = {}:{} ({}); is rank 0 running, the port "
        "free on its host and WORLD_SIZE the same on every rank?",
        env_.rank, env_.world, env_.master_addr, env_.master_port, why));
  }
  std::runtime_error lost(const std::string& why) const {
    return std::runtime_error(
        fmt::format("rank {} of {}: a collective with the other ranks failed ({}); another worker probably "
                    "stopped (see its own error) or stalled for longer than MOEFORGE_DIST_TIMEOUT = {} s",
                    env_.rank, env_.world, why, env_.timeout_s));
  }

  WorldEnv env_;
  c10::intrusive_ptr<c10d::Store> store_;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> pg_, async_pg_;
  struct Pending {
    std::vector<at::Tensor> bucket, tensors;  // the flat buffer in flight, where its sums go
    c10::intrusive_ptr<c10d::Work> work;
  };
  std::vector<Pending> pending_;
  double comm_s_ = 0;
};

}  // namespace

std::unique_ptr<DataParallel> join_gloo_group(const WorldEnv& env) { return std::make_unique<GlooGroup>(env); }

}  // namespace mf
