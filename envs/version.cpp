// Placeholder translation unit until the envs land.
namespace troupe::envs {
int envs_abi_version() { return 1; }
}  // namespace troupe::envs
