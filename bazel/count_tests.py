"""Counts test targets from a Bazel Build Event Protocol JSON file: `N passed, N failed`.

A test target that was configured but has no passing summary (it failed, timed out, or
failed to build) counts as failed, so a broken build can never look green.
"""

import json
import sys


def count(bep_path: str) -> tuple[list[str], list[str]]:
    tests, status = set(), {}
    with open(bep_path) as f:
        for line in f:
            event = json.loads(line)
            key = event.get("id", {})
            if "targetConfigured" in key and "testSize" in event.get("configured", {}):
                tests.add(key["targetConfigured"]["label"])
            if "testSummary" in key:
                status[key["testSummary"]["label"]] = event["testSummary"]["overallStatus"]
    passed = sorted(t for t in tests if status.get(t) in ("PASSED", "FLAKY"))
    failed = sorted(t for t in tests if t not in passed)
    for label in failed:
        print(f"FAILED: {label} ({status.get(label, 'did not build or run')})")
    return passed, failed


if __name__ == "__main__":
    passed, failed = count(sys.argv[1])
    print(f"{len(passed)} passed, {len(failed)} failed")
    sys.exit(1 if failed or not passed else 0)
