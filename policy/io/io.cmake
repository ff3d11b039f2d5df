# safetensors, HF model directories, tokenizers. target_sources(troupe_policy PRIVATE ...) and tests here.
