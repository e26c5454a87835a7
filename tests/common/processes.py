"""Finding the processes of a job, so a test can check that none outlives it; waiting for a process to get somewhere."""
import os
import time

import psutil


def processes_mentioning(text):
    """Live processes whose command line contains `text` (every msrun process of a job names its run dir)."""
    found = []
    for process in psutil.process_iter(["cmdline", "status"]):
        cmdline = " ".join(process.info["cmdline"] or [])
        if text in cmdline and process.info["status"] != psutil.STATUS_ZOMBIE and process.pid != os.getpid():
            found.append((process.pid, cmdline))
    return found


def wait_for_marker(marker, process, seconds=300):
    """Wait until `process` has written `marker` (a file: it is where the test wants it), or fail with its output."""
    deadline = time.monotonic() + seconds
    while not marker.exists() and process.poll() is None and time.monotonic() < deadline:  # wait on the disk
        time.sleep(0.05)
    assert marker.exists(), process.communicate()
