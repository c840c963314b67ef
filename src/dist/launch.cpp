#include "dist/launch.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <map>
#include <stdexcept>
#include <thread>

namespace mf {
namespace {

volatile std::sig_atomic_t g_forward = 0;
extern "C" void on_signal(int sig) { g_forward = sig; }

int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t n = sizeof(a);
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &n) != 0)
    throw std::runtime_error("launch: could not find a free TCP port on 127.0.0.1");
  ::close(fd);
  return ntohs(a.sin_port);
}

std::string describe(int status) {
  return WIFSIGNALED(status) ? fmt::format("was killed by signal {}", WTERMSIG(status))
                             : fmt::format("exited with code {}", WEXITSTATUS(status));
}

}  // namespace

int launch(const LaunchOptions& opt, const std::vector<std::string>& args) {
  if (opt.nproc < 1 || opt.nnodes < 1 || opt.node_rank < 0 || opt.node_rank >= opt.nnodes)
    throw std::runtime_error(fmt::format("launch: --nproc {} --nnodes {} --node-rank {} do not describe a world",
                                         opt.nproc, opt.nnodes, opt.node_rank));
  if (opt.nnodes > 1 && opt.master_port == 0)
    throw std::runtime_error("launch: --master ADDR:PORT is required with --nnodes > 1 (every node must agree)");
  const int port = opt.master_port ? opt.master_port : free_port();
  const int world = opt.nproc * opt.nnodes;
  std::map<pid_t, int> ranks;
  for (int local = 0; local < opt.nproc; ++local) {
    const int rank = opt.node_rank * opt.nproc + local;
    const pid_t pid = ::fork();
    if (pid < 0) throw std::runtime_error("launch: fork failed");
    if (pid == 0) {
      ::setenv("RANK", std::to_string(rank).c_str(), 1);
      ::setenv("WORLD_SIZE", std::to_string(world).c_str(), 1);
      ::setenv("LOCAL_RANK", std::to_string(local).c_str(), 1);
      ::setenv("LOCAL_WORLD_SIZE", std::to_string(opt.nproc).c_str(), 1);
      ::setenv("MASTER_ADDR", opt.master_addr.c_str(), 1);
      ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
      std::vector<char*> argv = {const_cast<char*>("moeforge")};
      for (auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      ::execv("/proc/self/exe", argv.data());
      std::_Exit(127);
    }
    ranks[pid] = rank;
  }
  spdlog::info("launch: {} worker(s) of {} (ranks {}..{}), rendezvous at {}:{}", opt.nproc, world,
               opt.node_rank * opt.nproc, opt.node_rank * opt.nproc + opt.nproc - 1, opt.master_addr, port);
  struct sigaction action {};
  action.sa_handler = on_signal;
  sigemptyset(&action.sa_mask);
  ::sigaction(SIGINT, &action, nullptr);
  ::sigaction(SIGTERM, &action, nullptr);

  int code = 0;
  auto stop_deadline = std::chrono::steady_clock::time_point::max();
  const auto stop_all = [&](int sig) {
    for (auto& [pid, rank] : ranks) ::kill(pid, sig);
    if (sig == SIGTERM) stop_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(opt.grace_seconds);
  };
  while (!ranks.empty()) {
    int status = 0;
    const pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid > 0 && ranks.count(pid)) {
      const int rank = ranks[pid];
      ranks.erase(pid);
      const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
      if (!ok && code == 0) {
        code = 1;
        spdlog::error("launch: rank {} {}; stopping the other {} worker(s)", rank, describe(status), ranks.size());
        stop_all(SIGTERM);
      }
      continue;
    }
    if (g_forward != 0) {
      spdlog::warn("launch: {} received, passed on to the workers", g_forward == SIGINT ? "SIGINT" : "SIGTERM");
      if (code == 0) code = 128 + g_forward;
      stop_all(SIGTERM);
      g_forward = 0;
    }
    if (std::chrono::steady_clock::now() > stop_deadline) {
      spdlog::error("launch: {} worker(s) still running {} s after SIGTERM; killing them", ranks.size(),
                    opt.grace_seconds);
      stop_all(SIGKILL);
      stop_deadline = std::chrono::steady_clock::time_point::max();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return code;
}

}  // namespace mf
