# Dense transformer ops (owned by the policy-model work). target_sources(troupe_kernels PRIVATE ...) and tests here.
