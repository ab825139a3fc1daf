# SPDX-License-Identifier: Apache-2.0
"""Peak memory of a benchmarked command's whole process tree (a driver and the workers it starts),
for the side-by-side scripts (vs_image_peer.py, vs_minilm_peer.py, vs_vit_peer.py), and `measured`,
which runs one side as they all do:

    result = process_tree.measured(cmd, env, "vs_vit_peer")  # its JSON line, with memory and load

    memory = process_tree.Memory(proc.pid)
    memory.start()
    ... proc.communicate() ...
    memory.done.set(); memory.join()
    memory.peak_sum   # bytes: the largest sum of the tree's resident sets, sampled every 0.1 s
    memory.hwm        # {pid: bytes}: each process's VmHWM (its own peak RSS, from the kernel)
"""
import json
import os
import subprocess
import sys
import threading

import idle

PAGE = os.sysconf("SC_PAGE_SIZE")


def tree(pid):
    """pid and its descendants, from /proc's parent links."""
    children = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open("/proc/%s/stat" % entry) as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                children.setdefault(ppid, []).append(int(entry))
            except (OSError, IndexError, ValueError):
                pass
    out, todo = [], [pid]
    while todo:
        q = todo.pop()
        out.append(q)
        todo += children.get(q, [])
    return out


class Memory(threading.Thread):
    """Samples the process tree of `pid`: the largest sum of resident sets, the largest VmHWM."""

    def __init__(self, pid):
        super().__init__(daemon=True)
        self.pid, self.peak_sum, self.hwm, self.done = pid, 0, {}, threading.Event()

    def run(self):
        while not self.done.is_set():
            total = 0
            for q in tree(self.pid):
                try:
                    with open("/proc/%d/statm" % q) as f:
                        total += int(f.read().split()[1]) * PAGE
                    with open("/proc/%d/status" % q) as f:
                        for line in f:
                            if line.startswith("VmHWM:"):
                                self.hwm[q] = max(self.hwm.get(q, 0), int(line.split()[1]) * 1024)
                except (OSError, ValueError):
                    pass
            self.peak_sum = max(self.peak_sum, total)
            self.done.wait(0.1)


def measured(cmd, env, name):
    """Runs `cmd` (which prints a JSON line last among its lines that start with "{") under
    idle.Run and Memory: its JSON object with peak_rss_sum_mb (the tree's largest summed resident
    set), max_process_hwm_mb (the largest process's own peak) and load (idle.Run's record). A failed
    run or one without a JSON line ends the script, naming `name`, the command and its output."""
    with idle.Run() as load:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        memory = Memory(proc.pid)
        memory.start()
        out, err = proc.communicate()
        memory.done.set()
        memory.join()
    if proc.returncode != 0:
        sys.exit("%s: failed: %s\n%s%s" % (name, " ".join(cmd), out, err[-4000:]))
    lines = [line for line in out.strip().splitlines() if line.startswith("{")]
    if not lines:
        sys.exit("%s: no JSON line from %s\n%s" % (name, " ".join(cmd), out))
    result = json.loads(lines[-1])
    result["peak_rss_sum_mb"] = memory.peak_sum / 2**20
    result["max_process_hwm_mb"] = max(memory.hwm.values(), default=0) / 2**20
    result["load"] = load.record
    return result
