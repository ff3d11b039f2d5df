// `troupe bench envs` case verifiers_zmq (verifiers_zmq.cpp): episodes through troupe's verifiers
// client against a real verifiers env server, vs the verifiers package's own Python client.
#pragma once

#include "troupe/bench/bench.h"

namespace troupe::bench {

// Prints the row (or, without the verifiers venv, says why on stderr); returns 0, or 1 when an
// episode failed.
int run_verifiers_zmq_case(const BenchOptions& opt);

}  // namespace troupe::bench
