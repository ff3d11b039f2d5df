// Placeholder translation unit until the actors land.
namespace troupe::actors {
int actors_abi_version() { return 1; }
}  // namespace troupe::actors
