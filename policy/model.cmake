# Model, arenas, forward/backward, KV-cache inference. target_sources(troupe_policy PRIVATE ...) and tests here.
