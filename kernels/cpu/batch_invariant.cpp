// The per-thread batch-invariant mode of the CPU ops (troupe/kernels/batch_invariant.h).
#include "troupe/kernels/batch_invariant.h"

namespace troupe::kernels {

namespace {
thread_local bool invariant_mode = false;
}  // namespace

bool batch_invariant() { return invariant_mode; }

BatchInvariantScope::BatchInvariantScope(bool on) : prev_(invariant_mode) { invariant_mode = on; }
BatchInvariantScope::~BatchInvariantScope() { invariant_mode = prev_; }

}  // namespace troupe::kernels
