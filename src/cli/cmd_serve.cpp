// `moeforge serve`: flags only; the server is src/serve/server.*.
#include <ATen/Parallel.h>

#include <iostream>

#include "cli/commands.h"
#include "core/runtime.h"
#include "model/weight_dtype.h"
#include "serve/server.h"

namespace mf::cli {

void register_serve_commands(CLI::App& app) {
  auto* sv = app.add_subcommand(
      "serve",
      "serve a language model over HTTP: OpenAI-compatible POST /v1/completions (stream: server-sent events), "
      "GET /v1/models, GET /health; batches concurrent requests; stops gracefully on SIGTERM / Ctrl-C");
  static std::string ckpt;
  static ServeOptions opt;
  static int threads = 0;
  static double grace = 10;
  static std::string dtype = "f32";
  sv->add_option("checkpoint", ckpt,
                 "checkpoint directory, its model.safetensors, a run directory, or a Hugging Face model directory")
      ->required();
  sv->add_option("--host", opt.host, "address to listen on (the default takes local clients only)")
      ->capture_default_str();
  sv->add_option("--port", opt.port, "TCP port (0: any free one, printed at start)")
      ->capture_default_str()
      ->check(CLI::Range(0, 65535));
  sv->add_option("--threads", threads, "intra-op threads of the model (0 = the machine's cores)")
      ->check(CLI::NonNegativeNumber);
  sv->add_option("--max-connections", opt.max_connections,
                 "connections served at once (a thread each, started as they arrive; more wait for one)")
      ->capture_default_str()
      ->check(CLI::Range(1, 4096));
  sv->add_option("--max-batch", opt.max_batch, "requests decoded together")
      ->capture_default_str()
      ->check(CLI::Range(1, 1024));
  sv->add_option("--batching", opt.batching,
                 "continuous: a request joins the rows decoding at the next step (where the decode engine runs the "
                 "model); static: requests that wait together decode together, later ones wait for the batch")
      ->capture_default_str()
      ->check(CLI::IsMember({"continuous", "static"}));
  sv->add_option("--batch-window-ms", opt.batch_window_ms,
                 "static batching: how long a request waits for others to batch with")
      ->capture_default_str()
      ->check(CLI::Range(0, 10000));
  sv->add_option("--max-body", opt.max_body, "largest request body in bytes (larger: 413)")->capture_default_str();
  sv->add_option("--name", opt.model_name, "the model id in responses (default: the run name)");
  sv->add_option("--grace", grace, "seconds to finish the requests in flight after SIGTERM / Ctrl-C")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 3600.0));
  add_weight_dtype_option(sv, dtype, true);
  sv->callback([] {
    if (threads > 0) set_compute_threads(threads);
    CompletionServer server(load_model(ckpt, parse_weight_dtype(dtype)), opt);
    std::cout << "listening on http://" << opt.host << ":" << server.port() << std::endl;
    serve_until_signal(server, grace);
  });
}

}  // namespace mf::cli
