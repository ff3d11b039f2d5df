"""A small verifiers (v1) environment for troupe's tests: a taskset of in-memory rows (no hub
download) whose reward is 1 when the model's reply contains the row's answer, and a harness that
runs its chat loop in-process: every model turn is one chat-completions call through the
environment's interception endpoint (which forwards it to the model endpoint troupe handed over).
Importable as a verifiers plugin id (`troupe_vf_echo`) once this folder is on PYTHONPATH.
TROUPE_VF_SLOW_EVERY=N and TROUPE_VF_SLEEP_S=S make every N-th episode sleep S seconds first."""
import asyncio
import itertools
import os

import verifiers.v1 as vf
from openai import AsyncOpenAI
from verifiers.v1.runtimes.base import ProgramResult

ROWS = [{"prompt": f"Say the letter {c}.", "answer": c} for c in "abcdefghij"]
TURNS = int(os.environ.get("TROUPE_VF_TURNS", "2"))
# Failure tests: every SLOW_EVERY-th episode sleeps SLEEP_S before its first model call.
SLOW_EVERY = int(os.environ.get("TROUPE_VF_SLOW_EVERY", "0"))
SLEEP_S = float(os.environ.get("TROUPE_VF_SLEEP_S", "0"))
_episodes = itertools.count()


class EchoData(vf.TaskData):
    answer: str = ""


class EchoTask(vf.Task[EchoData]):
    @vf.reward
    async def contains_answer(self, trace) -> float:
        replies = [str(n.message.content or "") for n in trace.nodes if n.message.role == "assistant"]
        return 1.0 if replies and self.data.answer in replies[-1] else 0.0


class EchoTaskset(vf.Taskset[EchoTask]):
    def load(self):
        for row in ROWS:
            yield EchoTask(EchoData(**row), self.config.task)


class EchoHarness(vf.Harness[vf.HarnessConfig]):
    APPENDS_SYSTEM_PROMPT = True
    SUPPORTS_MCP = False
    SUPPORTS_RESUME = False
    SUPPORTS_TOOL_INTERCEPTION = False
    EXECUTES_CODE = False
    NEEDS_CONTAINER = False

    async def launch(self, ctx, trace, runtime, endpoint, secret, mcp_urls, data, **kwargs):
        system_prompt, prompt = self.resolve_prompt(data)
        messages = [] if not system_prompt else [{"role": "system", "content": system_prompt}]
        messages.append({"role": "user", "content": prompt if isinstance(prompt, str) else data.prompt_text})
        client = AsyncOpenAI(base_url=endpoint, api_key=secret)
        sampling = ctx.sampling.model_dump(exclude_none=True) if ctx.sampling else {}
        reply = ""
        if SLOW_EVERY and next(_episodes) % SLOW_EVERY == SLOW_EVERY - 1:
            await asyncio.sleep(SLEEP_S)
        try:
            for turn in range(TURNS):
                r = await client.chat.completions.create(model=ctx.model, messages=messages, **sampling)
                reply = r.choices[0].message.content or ""
                messages.append({"role": "assistant", "content": reply})
                if turn + 1 < TURNS:
                    messages.append({"role": "user", "content": "Again."})
        finally:
            await client.close()
        return ProgramResult(exit_code=0, stdout=reply, stderr="")


__all__ = ["EchoTaskset", "EchoHarness"]
