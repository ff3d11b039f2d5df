"""troupe_env: serve a Python environment to troupe over the remote env protocol (envs/PROTOCOL.md).

    from troupe_env import Env, serve

    class Echo(Env):
        name = "echo"
        def reset(self, seed, options):
            return {"text": f"Say {seed}", "metadata": {"answer": str(seed)}}
        def verify(self, metadata, completion):
            return float(completion.strip() == metadata["answer"])

    if __name__ == "__main__":
        serve(Echo)

One Env instance runs one episode at a time (instances are pooled and reused); verify() is
stateless. A single-turn env only needs reset() and verify(): the default step() scores the action
with verify() against the metadata reset() returned and ends the episode.
"""
from .server import Env, EnvError, serve, handle_request, PROTOCOL
from . import answers  # answers.extract(text, how, pattern), answers.math_equal(answer, reference)

__all__ = ["Env", "EnvError", "serve", "handle_request", "PROTOCOL", "answers"]
__version__ = "0.1.0"
