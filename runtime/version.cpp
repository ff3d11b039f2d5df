// Placeholder translation unit until the runtime lands.
namespace troupe::runtime {
int runtime_abi_version() { return 1; }
}  // namespace troupe::runtime
