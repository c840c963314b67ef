// The server's connections as hostile or unusual clients use them, over raw sockets:
// pipelined requests, clients that send their request a byte at a time, prompts far longer
// than the model's context.
#include <arpa/inet.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "serve/served.h"

namespace mf {
namespace {

struct Socket {
  explicit Socket(int port) : fd(::socket(AF_INET, SOCK_STREAM, 0)) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) throw std::runtime_error("connect failed");
  }
  ~Socket() { ::close(fd); }
  void send(const std::string& s) const { ASSERT_EQ(::send(fd, s.data(), s.size(), MSG_NOSIGNAL), ssize_t(s.size())); }
  // Everything the server sends until it closes the connection or `seconds` pass; `closed` says which.
  std::string receive(double seconds, bool& closed) const {
    std::string out;
    const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    closed = false;
    for (;;) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - std::chrono::steady_clock::now());
      pollfd p{fd, POLLIN, 0};
      if (left.count() <= 0 || ::poll(&p, 1, static_cast<int>(left.count())) <= 0) return out;
      char buf[4096];
      const auto n = ::recv(fd, buf, sizeof buf, 0);
      if (n <= 0) return closed = true, out;
      out.append(buf, static_cast<size_t>(n));
    }
  }
  int fd;
};

std::string post(const std::string& body) {
  return "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
         std::to_string(body.size()) + "\r\n\r\n" + body;
}

size_t count(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t at = 0; (at = s.find(what, at)) != std::string::npos; at += what.size()) ++n;
  return n;
}

const std::string kGood = R"({"prompt": "The", "max_tokens": 2, "temperature": 0})";

// httplib 0.11 drops what it read ahead after each request, so the server answers one request
// per connection and closes it: a pipelining client sees the close at once (and sends the
// rest again) instead of waiting for answers that never come.
TEST(Connections, PipelinedRequestsGetOneAnswerAndAClose) {
  Served s;
  for (const std::string& first : {kGood, std::string("{bad json"), std::string(R"({"prompt": 5})")}) {
    Socket c(s.server->port());
    c.send(post(first) + post(kGood) + post(kGood));
    bool closed = false;
    const auto got = c.receive(10, closed);
    EXPECT_TRUE(closed) << first;
    EXPECT_EQ(count(got, "HTTP/1.1 "), 1u) << got;
    EXPECT_NE(got.find("Connection: close"), std::string::npos) << got;
    EXPECT_NE(got.find(first == kGood ? "HTTP/1.1 200" : "HTTP/1.1 400"), std::string::npos) << got;
  }
}

// 40 clients that sent half a request line hold a thread each; others are still answered (the
// old fixed pool of 32 threads left them waiting until the slow clients' reads timed out, 5 s),
// and the 40 connect at once (httplib's backlog of 5 made every 7th wait 1 s for a SYN retry).
TEST(Connections, SlowClientsDoNotStarveTheOthers) {
  Served s;
  std::vector<std::unique_ptr<Socket>> slow;
  for (int i = 0; i < 40; ++i) {
    slow.push_back(std::make_unique<Socket>(s.server->port()));
    slow.back()->send("POST /v1/comp");
  }
  for (int i = 0; i < 4; ++i) {
    Socket c(s.server->port());
    c.send(post(kGood));
    bool closed = false;
    const auto got = c.receive(4, closed);
    EXPECT_TRUE(closed);
    EXPECT_NE(got.find("HTTP/1.1 200"), std::string::npos) << "probe " << i << ": " << got;
  }
}

// A prompt that cannot fit the context whatever the tokenizer does is refused before tokenizing:
// more than 64 tokens x K bytes, K = 3 x (the longest token + 1). At the bound itself the
// prompt is tokenized and refused by its token count instead.
TEST(Connections, APromptBeyondTheContextIsRefusedUnread) {
  Served s;
  const auto ask = [&](size_t bytes) {
    Socket c(s.server->port());
    c.send(post(nlohmann::json{{"prompt", std::string(bytes, 'x')}}.dump()));
    bool closed = false;
    return c.receive(10, closed);
  };
  const auto got = ask(500000);
  EXPECT_NE(got.find("HTTP/1.1 400"), std::string::npos) << got;
  EXPECT_NE(got.find("the prompt (500000 bytes) cannot fit the model's context of 64 tokens"), std::string::npos)
      << got;
  EXPECT_NE(got.find(R"("param":"prompt")"), std::string::npos) << got;
  size_t longest = 0;
  for (int id = 0; id < s.tok.vocab_size(); ++id) longest = std::max(longest, s.tok.decode({id}).size());
  const size_t bound = 64 * 3 * (longest + 1);
  EXPECT_NE(got.find(fmt::format("at most {} bytes", 3 * (longest + 1))), std::string::npos) << got;
  EXPECT_NE(ask(bound + 1).find("cannot fit the model's context"), std::string::npos);
  const auto at_bound = ask(bound);
  EXPECT_NE(at_bound.find(R"("param":"max_tokens")"), std::string::npos) << at_bound.substr(0, 400);
}

}  // namespace
}  // namespace mf
