# Replaying executable of a simulated node (gpugate sim).  Installed as
# FLEET/NODE/bin/<tool> with a "#!python -I -S" line; stdlib only, so it
# starts fast.  It looks its argv up in FLEET/NODE/replay.json: the exact
# "tool arg ..." key first, then the longest "tool prefix *" key.
import json
import os
import sys
import time


def main():
    # gpugate runs the checked file as /proc/self/fd/N, so a script's argv[0]
    # is not its path: the installer writes SELF above this text.
    me = globals().get("SELF") or os.path.abspath(sys.argv[0])
    here = os.path.dirname(me)
    table_path = os.path.join(os.path.dirname(here), "replay.json")
    key = " ".join([os.path.basename(me)] + sys.argv[1:])
    try:
        with open(table_path) as handle:
            table = json.load(handle)
    except (OSError, ValueError) as exc:
        sys.stderr.write("sim: cannot read %s: %s\n" % (table_path, exc))
        return 125
    entry = table.get(key)
    if entry is None:
        best = ""
        for pattern in table:
            if pattern.endswith(" *") and key.startswith(pattern[:-1]) and len(pattern) > len(best):
                best = pattern
        entry = table.get(best)
    if entry is None:
        sys.stderr.write("sim: no recording for: %s\n" % key)
        return 127
    if entry.get("hang"):
        while True:  # a wedged tool: only a kill ends it
            time.sleep(3600)
    if entry.get("sleep"):
        time.sleep(float(entry["sleep"]))
    sys.stdout.write(entry.get("stdout", ""))
    sys.stderr.write(entry.get("stderr", ""))
    sys.stdout.flush()
    return int(entry.get("rc", 0))


if __name__ == "__main__":
    sys.exit(main())
