"""Runs of the benchmark programs that print their result as one JSON line,
for the compare_*.py scripts: a failed required run (the baseline) ends the
script; any other failed run (kiln's CUDA graph, a torch.compile peer) is
reported under the table instead, so the rows measured still print, and the
script then exits with status 1."""
import json
import subprocess
import sys


class PeerRuns:
    def __init__(self, who, cwd):
        self.who = who  # the script's name, for messages
        self.cwd = cwd
        self.failures = []

    def run(self, command, env, required=True, timeout=None):
        """The run's JSON line, or None for a failed run that is not required; a run past
        `timeout` seconds is killed and counts as failed."""
        try:
            result = subprocess.run(command, env=env, capture_output=True, text=True, cwd=self.cwd, timeout=timeout)
        except subprocess.TimeoutExpired:
            return self._failed(command, required, f"ran past {timeout:g} s and was killed", f"killed after {timeout:g} s")
        if result.returncode != 0:
            return self._failed(command, required, f"failed ({result.returncode}):\n{result.stderr[-3000:]}",
                                f"failed with exit {result.returncode} (stderr above)")
        return json.loads(result.stdout.strip().splitlines()[-1])

    def _failed(self, command, required, what, summary):
        """A required run's failure ends the script; another's is reported and remembered."""
        message = f"{self.who}: {' '.join(command)} {what}"
        if required:
            sys.exit(message)
        print(message, file=sys.stderr)
        self.failures.append(f"{' '.join(command[:2])} ... {summary}")
        return None

    def finish(self):
        """Names the failed runs under the table; exit status 1 if there were any."""
        for failure in self.failures:
            print(f"\nFAILED: {failure}")
        if self.failures:
            sys.exit(1)
