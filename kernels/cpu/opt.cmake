# MoE routing (grouped + masked loop) and activation offload engine (owned by the optimizations work).
