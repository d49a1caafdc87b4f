#!/usr/bin/env python3
"""The RL program resumed from a saved state continues bit for bit.

check_resume.py PROGRAM INIT FOLDER: runs PROGRAM (example_09_rl) three times from the policy file
INIT: 4 steps straight; 2 steps then --save-state; --resume for 2 more. The resumed run's per-step
records (every field but the timings) must equal the last 2 steps of the straight run exactly.
Exit 0 and "ok" when they do, 1 naming the first difference otherwise.
"""
import json
import os
import subprocess
import sys

TIMINGS = {"rollout_seconds", "update_seconds", "calibration_seconds", "monitor_seconds",
           "rollout_tokens_per_second", "update_tokens_per_second"}


def run(program, init, out, extra):
    cmd = [program, "--variants", "fp8_calibrated", "--seeds", "0", "--no-faults", "--threads", "2",
           "--init", init, "--out", out] + extra
    done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if done.returncode != 0:
        sys.exit("check_resume: " + " ".join(cmd) + " failed:\n" + done.stdout)
    with open(os.path.join(out, "report.json")) as f:
        return json.load(f)["runs"][0]


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    program, init, folder = sys.argv[1:]
    state = os.path.join(folder, "state.bin")
    whole = run(program, init, os.path.join(folder, "whole"), ["--steps", "4"])
    run(program, init, os.path.join(folder, "first"), ["--steps", "2", "--save-state", state])
    resumed = run(program, init, os.path.join(folder, "resumed"), ["--steps", "2", "--resume", state])
    a, b = whole["per_step"], resumed["per_step"]
    if resumed["steps"] != 2 or whole["steps"] != 4:
        sys.exit("check_resume: expected 4 and 2 steps, got %s and %s" % (whole["steps"], resumed["steps"]))
    compared = 0
    for key, values in a.items():
        if key in TIMINGS:
            continue
        if values[2:] != b[key]:
            print("check_resume: %s differs after the resume: %r against %r" % (key, values[2:], b[key]))
            return 1
        compared += 1
    if compared < 20:
        sys.exit("check_resume: only %d fields compared" % compared)
    print("ok: %d per-step fields of steps 2-3 equal bit for bit after the resume" % compared)
    return 0


if __name__ == "__main__":
    sys.exit(main())
