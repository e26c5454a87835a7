"""Finding the processes of a job, so a test can check that none outlives it."""
import os

import psutil


def processes_mentioning(text):
    """Live processes whose command line contains `text` (every msrun process of a job names its run dir)."""
    found = []
    for process in psutil.process_iter(["cmdline", "status"]):
        cmdline = " ".join(process.info["cmdline"] or [])
        if text in cmdline and process.info["status"] != psutil.STATUS_ZOMBIE and process.pid != os.getpid():
            found.append((process.pid, cmdline))
    return found
