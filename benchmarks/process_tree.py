# SPDX-License-Identifier: Apache-2.0
"""Peak memory of a benchmarked command's whole process tree (a driver and the workers it starts),
for the side-by-side scripts (vs_minilm_peer.py, vs_vit_peer.py):

    memory = process_tree.Memory(proc.pid)
    memory.start()
    ... proc.communicate() ...
    memory.done.set(); memory.join()
    memory.peak_sum   # bytes: the largest sum of the tree's resident sets, sampled every 0.1 s
    memory.hwm        # {pid: bytes}: each process's VmHWM (its own peak RSS, from the kernel)
"""
import os
import threading

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
