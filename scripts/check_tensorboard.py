#!/usr/bin/env python3
"""Reads a kiln-written TensorBoard run with TensorBoard's own reader
(EventAccumulator, the loader behind TensorBoard's scalar and hparams
dashboards) and checks it against what kiln logged.

usage: check_tensorboard.py RUN_DIR [EXPECTED_JSON]

EXPECTED_JSON: {"scalars": {"tag": [[step, value], ...]}, "hparams": {"key": value}}
Values are compared as float32 (TensorBoard's simple_value). Without
EXPECTED_JSON it only prints what TensorBoard read. Exits 1 on a mismatch.
tests/test_tensorboard_logger.cpp runs it where `import tensorboard` works
(pip install tensorboard; Debian has no package for it).
"""
import json
import math
import struct
import sys

from tensorboard.backend.event_processing import event_accumulator
from tensorboard.plugins.hparams import plugin_data_pb2


def as_float32(value):
    return struct.unpack("f", struct.pack("f", value))[0]


def read_run(run_dir):
    accumulator = event_accumulator.EventAccumulator(
        run_dir, size_guidance={event_accumulator.SCALARS: 0, event_accumulator.TENSORS: 0})
    accumulator.Reload()
    scalars = {tag: [(event.step, event.value) for event in accumulator.Scalars(tag)]
               for tag in accumulator.Tags()["scalars"]}
    hparams = {}
    try:
        contents = accumulator.PluginTagToContent("hparams").values()
    except KeyError:  # no hparams summary in the run
        contents = []
    for content in contents:
        data = plugin_data_pb2.HParamsPluginData.FromString(content)
        if data.HasField("session_start_info"):
            for key, value in data.session_start_info.hparams.items():
                hparams[key] = getattr(value, value.WhichOneof("kind"))
    return accumulator.file_version, scalars, hparams


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    file_version, scalars, hparams = read_run(sys.argv[1])
    print(f"file_version: {file_version}")
    for tag, events in sorted(scalars.items()):
        print(f"scalar {tag}: " + ", ".join(f"step {step} = {value:.9g}" for step, value in events))
    for key, value in sorted(hparams.items()):
        print(f"hparam {key}: {value!r}")
    if len(sys.argv) == 2:
        return
    expected = json.loads(sys.argv[2])
    errors = []
    if file_version != 2.0:
        errors.append(f"file_version is {file_version}, expected 2.0 (brain.Event:2)")
    for tag, events in expected.get("scalars", {}).items():
        want = [(step, as_float32(value)) for step, value in events]
        got = scalars.get(tag)
        if got is None:
            errors.append(f"scalar {tag}: missing")
        elif [step for step, _ in got] != [step for step, _ in want] or any(
                not (math.isnan(a) and math.isnan(b)) and a != b for (_, a), (_, b) in zip(got, want)):
            errors.append(f"scalar {tag}: read {got}, expected {want}")
    for key, value in expected.get("hparams", {}).items():
        if hparams.get(key) != value:
            errors.append(f"hparam {key}: read {hparams.get(key)!r}, expected {value!r}")
    for error in errors:
        print("MISMATCH " + error)
    print("tensorboard check: " + ("FAILED" if errors else "OK"))
    sys.exit(1 if errors else 0)


if __name__ == "__main__":
    main()
