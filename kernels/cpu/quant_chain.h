// Which decode chain the CPU quant ops run (internal to kernels/cpu/, for the tests that compare
// them): the AVX-512F two-row chains where the CPU has AVX-512F, else the AVX2 chain. Both give the
// same bits; allow_two_row(false) makes the ops take the AVX2 chain so a test can show it.
#pragma once

namespace troupe::kernels::quant_chain {

// Whether the two-row chains may run (default true). Not to be switched while an op runs.
void allow_two_row(bool on);
// Whether the ops run them now: allowed, and the CPU has AVX-512F (and the AVX2 chain's needs).
bool two_row_active();

}  // namespace troupe::kernels::quant_chain
