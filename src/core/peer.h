// Running a Python peer of a benchmark (bench/peers/*.py with Debian's python3-torch).
#pragma once
#include <nlohmann/json.hpp>
#include <string>

namespace mf {

// `python3 SCRIPT ARGS`; its last output line is JSON. default_env: run it as a user's shell
// would, without the OMP_WAIT_POLICY, OPENBLAS_CORETYPE and OPENBLAS_THREAD_TIMEOUT that moeforge sets
// (children inherit them). A missing script or a failure becomes {"skipped": why}.
nlohmann::json run_peer(const std::string& script, const std::string& args, bool default_env);

}  // namespace mf
