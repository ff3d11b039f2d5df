// Placeholder translation unit until the policy lands.
namespace troupe::policy {
int policy_abi_version() { return 1; }
}  // namespace troupe::policy
