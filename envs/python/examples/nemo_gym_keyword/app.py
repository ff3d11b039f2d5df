"""A NeMo Gym resource server of your own, outside the nemo-gym package (envs/README.md, "NeMo Gym
resource servers"): the reward is `keyword_reward` (a field of the server's config, set from the
YAML's config.server_config) when the model's reply contains the row's `keyword`. It imports its
scoring from lib/ (the YAML's environment: {PYTHONPATH: lib}, relative to its cwd:), and prints one
line per verify to stdout, which troupe keeps in run.dir/logs/.
    python envs/python/nemo_gym_serve.py app.py --port PORT     (from this folder)"""
from keyword_scoring import reply_text, contains_keyword  # lib/keyword_scoring.py

from nemo_gym.base_resources_server import (
    BaseResourcesServerConfig,
    BaseVerifyRequest,
    BaseVerifyResponse,
    SimpleResourcesServer,
)


class KeywordServerConfig(BaseResourcesServerConfig):
    keyword_reward: float = 1.0


class KeywordVerifyRequest(BaseVerifyRequest):
    keyword: str


class KeywordVerifyResponse(BaseVerifyResponse):
    keyword: str


class KeywordResourcesServer(SimpleResourcesServer):
    config: KeywordServerConfig

    async def verify(self, body: KeywordVerifyRequest) -> KeywordVerifyResponse:
        found = contains_keyword(reply_text(body.response), body.keyword)
        reward = self.config.keyword_reward if found else 0.0
        print(f"verify: keyword {body.keyword!r} found={found} reward={reward}", flush=True)
        return KeywordVerifyResponse(**body.model_dump(), reward=reward)
