// Placeholder translation unit until the learner lands.
namespace troupe::learner {
int learner_abi_version() { return 1; }
}  // namespace troupe::learner
