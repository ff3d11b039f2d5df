"""kill -9 crash consistency of a run directory (reliability.kill9, reliability.kill9_trials).

A tiny GRPO run (tests/reliability/tiny.yaml with the arithmetic env in an isolated worker, a
checkpoint every step, keep_last 2, an eval every 3 steps, trajectories) is SIGKILLed, the whole
process group at once, then checked and continued:

  * metrics.jsonl and trajectories/grpo.jsonl: every line that ends in a newline is a JSON object;
    only the last may be torn (no newline); the complete rows are a prefix of an uninterrupted
    reference run's rows (every value but the timing ones, keys ending in _s), so nothing is
    duplicated or lost before the kill;
  * every checkpoints/step_N that passes the verifier's check (state.json lists each file with its
    size and CRC-32, like learner::verify_checkpoint) is the reference run's step_N: the same files,
    the same CRCs, the same state but for its timing (wall time; async: pipeline.bin, whose
    rollouts carry their times); `latest` points at such a step;
  * no process of the run outlives the kill (an isolated env worker exits with its parent);
  * `--resume` (a run killed before its first checkpoint: the run started again in the same
    run.dir) finishes, and the whole run directory then equals the reference: the metrics rows and
    the trajectories, row for row, bit for bit but the timing values, and nothing torn.

  kill9.py TROUPE SRC WORK fixed                  kills at fixed points (reliability.kill9)
  kill9.py TROUPE SRC WORK trials [--trials N] [--seed S] [--time-limit SECONDS] [--variant sync|async|sft]
                                                  N trials at random seeded times (reliability.kill9_trials)
"""
import argparse
import ctypes
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
import zlib

ARGS = None
SETS = []  # the --set flags of every run (the reference keeps every step (keep_last 100))
EXTRA = []  # a fixed case's own --set flags (for the killed run and its resumes)
UNCOMMITTED = []  # kills that left a whole step newer than latest (not used: latest is the commit point)


def fail(msg):
    print("FAIL:", msg, flush=True)
    sys.exit(1)


def strip_timing(x):
    """x without the values that depend on timing (keys ending in _s; the scorers' batch sizes, keys
    ending in batch_requests or batch_requests_max), recursively."""
    if isinstance(x, dict):
        return {k: strip_timing(v) for k, v in x.items() if not k.endswith(("_s", "batch_requests", "batch_requests_max"))}
    if isinstance(x, list):
        return [strip_timing(v) for v in x]
    return x


def read_jsonl(path):
    """(rows, torn): the complete lines of path as objects (each must be one), and the torn last line's number."""
    if not os.path.exists(path):
        return [], 0
    with open(path, "rb") as f:
        parts = f.read().split(b"\n")
    rows = []
    for n, line in enumerate(parts[:-1], 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as e:
            fail("%s:%d: a complete line that is not JSON (%s): %r" % (path, n, e, line[:120]))
        if not isinstance(row, dict):
            fail("%s:%d: not a JSON object" % (path, n))
        rows.append(row)
    torn = 0
    if parts[-1].strip():
        try:
            rows.append(json.loads(parts[-1]))  # a whole row that lost only its newline
        except ValueError:
            torn = len(parts)
    return rows, torn


def verified(step_dir):
    """The state.json of a step directory that passes the verifier's checks, else None."""
    try:
        with open(os.path.join(step_dir, "state.json")) as f:
            state = json.load(f)
    except (OSError, ValueError):
        return None
    files = state.get("files")
    if not isinstance(files, dict) or not isinstance(state.get("step"), int):
        return None
    if "model.safetensors" not in files or "optimizer.safetensors" not in files:
        return None
    for rel, e in files.items():
        p = os.path.join(step_dir, rel)
        try:
            with open(p, "rb") as f:
                data = f.read()
        except OSError:
            return None
        if len(data) != e["bytes"] or "%08x" % (zlib.crc32(data) & 0xFFFFFFFF) != e["crc32"]:
            return None
    return state


def comparable_state(state):
    """state.json but its timing: the wall time, and async's pipeline.bin (its finished rollouts
    carry their sampling and env times; what they hold is checked by the resumed run's rows)."""
    s = json.loads(json.dumps(state))
    s.get("extra", {}).pop("wall_s", None)
    s.get("files", {}).pop("pipeline.bin", None)
    return s


class Reference:
    def __init__(self, run_dir):
        self.dir = run_dir
        self.metrics, _ = read_jsonl(os.path.join(run_dir, "metrics.jsonl"))
        self.trajs, _ = read_jsonl(os.path.join(run_dir, "trajectories", "grpo.jsonl"))
        self.m = [strip_timing(r) for r in self.metrics]
        self.t = [strip_timing(r) for r in self.trajs]
        self.states = {}
        ck = os.path.join(run_dir, "checkpoints")
        for name in os.listdir(ck):
            if re.fullmatch(r"step_\d+", name):
                st = verified(os.path.join(ck, name))
                if st is None:
                    fail("the reference's %s does not verify" % name)
                self.states[name] = comparable_state(st)


def check_dir(run_dir, ref, what):
    """The run directory after a kill: see the module's docstring. Returns (latest step or None, torn lines)."""
    torn_total = 0
    for rel, want in (("metrics.jsonl", ref.m), ("trajectories/grpo.jsonl", ref.t)):
        rows, torn = read_jsonl(os.path.join(run_dir, rel))
        torn_total += 1 if torn else 0
        got = [strip_timing(r) for r in rows]
        if got != want[:len(got)]:
            i = next(i for i, (a, b) in enumerate(zip(got + [None], want + [None])) if a != b)
            fail("%s: %s row %d differs from the reference's (duplicated, lost or changed): %s vs %s"
                 % (what, rel, i + 1, json.dumps(got[i] if i < len(got) else None)[:300],
                    json.dumps(want[i] if i < len(want) else None)[:300]))
    ck = os.path.join(run_dir, "checkpoints")
    whole = {}
    if os.path.isdir(ck):
        for name in os.listdir(ck):
            if not re.fullmatch(r"step_\d+", name):
                continue
            st = verified(os.path.join(ck, name))
            if st is None:
                continue  # not whole: the verifier refuses it (and latest must not point at it)
            if name not in ref.states:
                fail("%s: %s verifies but the reference has no such step" % (what, name))
            if comparable_state(st) != ref.states[name]:
                fail("%s: %s verifies but differs from the reference's step (a wrong checkpoint)" % (what, name))
            whole[name] = st["step"]
    latest = os.path.join(ck, "latest")
    if not os.path.lexists(latest):
        return None, torn_total
    target = os.readlink(latest)
    if target not in whole:
        fail("%s: latest -> %s, which is not a whole checkpoint" % (what, target))
    if max(whole.values()) > whole[target]:  # killed between a step's rename and the latest swap
        UNCOMMITTED.append(what)
    return whole[target], torn_total


def check_finished(run_dir, ref, what):
    for rel, want in (("metrics.jsonl", ref.m), ("trajectories/grpo.jsonl", ref.t)):
        rows, torn = read_jsonl(os.path.join(run_dir, rel))
        if torn:
            fail("%s: %s still has a torn line %d after the resumed run" % (what, rel, torn))
        got = [strip_timing(r) for r in rows]
        if got != want:
            diff = [i for i, (a, b) in enumerate(zip(got, want)) if a != b]
            fail("%s: %s: %d rows vs the reference's %d; first differing row %s" % (
                what, rel, len(got), len(want), diff[:1] or "(a prefix)"))


def orphans():
    """Processes whose parent is this driver (run under PR_SET_CHILD_SUBREAPER): a killed run's leftovers."""
    me, out = os.getpid(), []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % d) as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == me and fields[0] != "Z":
            out.append(int(d))
    while True:  # reap the exited ones
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            break
    return out


def start(run_dir, resume, log):
    cmd = [ARGS.troupe, "run", os.path.join(ARGS.src, "tests", "reliability", "tiny.yaml"), "--set", "run.dir=" + run_dir]
    cmd += ["--resume", run_dir] if resume else []
    return subprocess.Popen(cmd + SETS + EXTRA, stdout=subprocess.DEVNULL, stderr=open(log, "wb"), start_new_session=True)


def kill_group(p):
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    return p.wait()


def wait_ok(p, log, what):
    rc = p.wait()
    if rc != 0:
        sys.stdout.write(open(log).read()[-3000:])
        fail("%s: exit %d" % (what, rc))


def no_orphans(what):
    for _ in range(200):  # an isolated worker notices its parent's death within its poll interval
        left = orphans()
        if not left:
            return
        time.sleep(0.05)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    fail("%s: processes %s outlived the kill of their run" % (what, left))


def kill_when(run_dir, resume, log, cond, what, deadline_s=60):
    """Starts a run and SIGKILLs its process group as soon as cond(run_dir, elapsed) holds."""
    p = start(run_dir, resume, log)
    t0 = time.monotonic()
    while p.poll() is None and not cond(run_dir, time.monotonic() - t0):
        if time.monotonic() - t0 > deadline_s:
            kill_group(p)
            fail("%s: the kill point was never reached" % what)
        time.sleep(0.002)
    finished = p.poll() is not None
    rc = kill_group(p)
    no_orphans(what)
    return finished and rc == 0


def continue_run(run_dir, latest, log, what):
    """--resume from latest (a run with no checkpoint yet: started again in the same run.dir)."""
    wait_ok(start(run_dir, latest is not None, log), log, what + " (resumed)")


def at_time(t):
    return lambda d, el: el >= t


def has_row(step):
    def cond(d, el):
        rows, _ = read_jsonl(os.path.join(d, "metrics.jsonl"))  # (none while the file is missing)
        return any(r.get("step", 0) >= step for r in rows)
    return cond


def saving(step):
    def cond(d, el):
        ck = os.path.join(d, "checkpoints")
        return os.path.isdir(ck) and any(n.startswith(".tmp_step_%d." % step) for n in os.listdir(ck))
    return cond


def fixed(ref, work):
    global EXTRA
    # (name, kill point of the run, kill point of its first resume or None, --set flags of the case)
    cases = [("startup", at_time(0.15), None, []),
             ("before_first_checkpoint", has_row(2), None, ["--set", "checkpointing.every=4"]),
             ("mid_checkpoint", saving(3), None, []),
             ("after_row", has_row(4), None, []),
             ("resume_killed", has_row(2), has_row(4), [])]
    for name, cond, cond2, extra in cases:
        EXTRA = extra
        d = os.path.join(work, name)
        kill_when(d, False, d + ".log", cond, name)
        latest, torn = check_dir(d, ref, name)
        if cond2 is not None:
            kill_when(d, latest is not None, d + ".resume1.log", cond2, name + " (resume)")
            latest, torn = check_dir(d, ref, name + " (resume)")
        continue_run(d, latest, d + ".resume.log", name)
        check_finished(d, ref, name)
        print("%s: killed, latest %s, resumed: equal to the reference" % (name, latest), flush=True)
    EXTRA = []
    torn_lines(ref, work)


def torn_lines(ref, work):
    """A kill mid-write leaves a last line without its newline: troupe report warns and plots; --resume drops it."""
    d = os.path.join(work, "torn")
    kill_when(d, False, d + ".log", has_row(3), "torn")
    latest, _ = check_dir(d, ref, "torn")
    if latest is None:
        fail("torn: no checkpoint by step 3")
    paths = [os.path.join(d, "metrics.jsonl"), os.path.join(d, "trajectories", "grpo.jsonl")]
    lines = []
    for p in paths:
        with open(p, "rb") as f:
            data = f.read()
        if not data.endswith(b"\n"):
            data = data[:data.rfind(b"\n") + 1]
        with open(p, "wb") as f:
            f.write(data + b'{"step": 99, "phase": "grpo", "reward_m')
        lines.append(data.count(b"\n") + 1)
    r = subprocess.run([ARGS.troupe, "report", d], capture_output=True, text=True)
    want = "%s:%d: warning: a torn last line" % (paths[0], lines[0])
    if r.returncode != 0 or want not in r.stderr:
        fail("torn: troupe report exit %d, stderr %r (expected a warning %r)" % (r.returncode, r.stderr[-600:], want))
    log = d + ".resume.log"
    continue_run(d, latest, log, "torn")
    text = open(log).read()
    for p, n in zip(paths, lines):
        want = "troupe: warning: %s:%d: a torn last line" % (p, n)
        if want not in text:
            fail("torn: the resume did not say %r" % want)
    check_finished(d, ref, "torn")
    print("torn: troupe report warned and plotted, --resume dropped both torn lines, equal to the reference", flush=True)


def trials(ref, work, ref_s, steps_from_s):
    """Each trial kills at a random time: a quarter anywhere in the reference's time, the others while
    it was writing steps (after its start-up), some of them the resume too."""
    rng = random.Random(ARGS.seed)
    t_start = time.monotonic()
    stats = {"resumed": 0, "restarted": 0, "finished_first": 0, "double_kill": 0, "torn": 0}
    done = 0
    for i in range(ARGS.trials):
        if ARGS.time_limit and time.monotonic() - t_start > ARGS.time_limit:
            fail("only %d of %d trials within --time-limit %s s" % (done, ARGS.trials, ARGS.time_limit))
        d = os.path.join(work, "trial_%03d" % i)
        lo = 0.0 if rng.random() < 0.25 else 0.9 * steps_from_s
        t_kill = rng.uniform(lo, ref_s)
        double = rng.random() < 0.25
        t_kill2 = rng.uniform(0.9 * steps_from_s, ref_s)
        what = "trial %d (kill at %.3f s%s)" % (i, t_kill, ", resume killed at %.3f s" % t_kill2 if double else "")
        if kill_when(d, False, d + ".log", at_time(t_kill), what):
            stats["finished_first"] += 1
        latest, torn = check_dir(d, ref, what)
        stats["torn"] += torn
        if double:
            kill_when(d, latest is not None, d + ".resume1.log", at_time(t_kill2), what + " (resume)")
            latest, torn = check_dir(d, ref, what + " (resume)")
            stats["torn"] += torn
            stats["double_kill"] += 1
        continue_run(d, latest, d + ".resume.log", what)
        check_finished(d, ref, what)
        stats["resumed" if latest is not None else "restarted"] += 1
        done += 1
        print("%s: latest %s, %s, equal to the reference" % (what, latest, "resumed" if latest is not None else
                                                               "no checkpoint: started again"), flush=True)
        subprocess.run(["rm", "-rf", d])
    stats["newer_than_latest"] = len(UNCOMMITTED)
    print("%d/%d trials resumed (or restarted) correctly: %s; %.0f s" % (
        done, ARGS.trials, json.dumps(stats), time.monotonic() - t_start), flush=True)


# --variant: the run killed (sync GRPO by default)
VARIANTS = {
    "sync": [],
    # async GRPO, two parts per step, rollouts up to 2 versions old: checkpoints keep finished rollouts
    "async": ["rollout.async=true", "rollout.max_staleness=2", "rollout.async_chunks=2", "optimizer.schedule=constant"],
    # 3 SFT steps, then GRPO (one global step count over both phases)
    "sft": ["sft.enabled=true", "sft.max_steps=3", "sft.batch_size=8"],
}


def main():
    global ARGS, SETS
    ap = argparse.ArgumentParser()
    ap.add_argument("troupe")
    ap.add_argument("src")
    ap.add_argument("work")
    ap.add_argument("mode", choices=["fixed", "trials"])
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--time-limit", type=float, default=0)
    ap.add_argument("--variant", choices=sorted(VARIANTS), default="sync")
    ARGS = ap.parse_args()
    SETS = ["--set", "envs[0].type=builtin", "--set", "envs[0].path=", "--set", "envs[0].name=arithmetic",
            "--set", "envs[0].isolate=true", "--set", "grpo.max_steps=8", "--set", "eval.every=3",
            "--set", "checkpointing.enabled=true", "--set", "checkpointing.every=1", "--set", "checkpointing.keep_last=2"]
    SETS += [a for kv in VARIANTS[ARGS.variant] for a in ("--set", kv)]
    # (orphaned descendants of a killed run become this driver's children, so they can be seen)
    ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    work = os.path.abspath(ARGS.work)
    subprocess.run(["rm", "-rf", work])
    os.makedirs(work)
    ref_dir = os.path.join(work, "reference")
    p = subprocess.Popen([ARGS.troupe, "run", os.path.join(ARGS.src, "tests", "reliability", "tiny.yaml"),
                          "--set", "run.dir=" + ref_dir] + SETS + ["--set", "checkpointing.keep_last=100"],
                         stdout=subprocess.DEVNULL, stderr=open(ref_dir + ".log", "wb"))
    t0, first_row_s = time.monotonic(), None
    while p.poll() is None:  # when the first row appears: start-up ends, the steps begin
        if first_row_s is None and has_row(1)(ref_dir, 0):
            first_row_s = time.monotonic() - t0
        time.sleep(0.002)
    wait_ok(p, ref_dir + ".log", "reference")
    ref_s = time.monotonic() - t0
    ref = Reference(ref_dir)
    print("reference: %d rows, %d trajectories, checkpoints %s, %.2f s (the first row at %.2f s)" % (
        len(ref.m), len(ref.t), sorted(ref.states), ref_s, first_row_s or 0), flush=True)
    if ARGS.mode == "fixed":
        fixed(ref, work)
    else:
        trials(ref, work, ref_s, first_row_s or 0)


if __name__ == "__main__":
    main()
