#!/usr/bin/env python3
"""Reads a kiln-written TensorBoard run with TensorBoard's own reader
(EventAccumulator, the loader behind TensorBoard's scalar, image, histogram
and hparams dashboards) and checks it against what kiln logged.

usage: check_tensorboard.py RUN_DIR [EXPECTED_JSON]

EXPECTED_JSON: {"scalars": {"tag": [[step, value], ...]}, "hparams": {"key": value},
                "images": {"tag": [[step, width, height], ...]},
                "histograms": {"tag": [[step, min, max, num, sum], ...]}}
Scalars are compared as float32 (TensorBoard's simple_value), histogram
statistics as float64 to a relative 1e-12. Every image must be a PNG whose
header and zlib stream hold exactly width x height pixels; every histogram's
bucket counts must add up to num over increasing bucket limits. Without
EXPECTED_JSON it only prints what TensorBoard read. Exits 1 on a mismatch.
tests/test_tensorboard_logger.cpp runs it where `import tensorboard` works
(pip install tensorboard; Debian has no package for it).
"""
import json
import math
import struct
import sys
import zlib

from tensorboard.backend.event_processing import event_accumulator
from tensorboard.plugins.hparams import plugin_data_pb2


def as_float32(value):
    return struct.unpack("f", struct.pack("f", value))[0]


def png_problem(data, width, height):
    """What is wrong with `data` as a width x height 8-bit grayscale or RGB PNG, or None."""
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        return "no PNG signature"
    chunks, at = {}, 8
    while at + 12 <= len(data):
        length, kind = struct.unpack(">I4s", data[at:at + 8])
        body = data[at + 8:at + 8 + length]
        if struct.unpack(">I", data[at + 8 + length:at + 12 + length])[0] != zlib.crc32(kind + body):
            return f"CRC mismatch in {kind!r}"
        chunks[kind] = chunks.get(kind, b"") + body
        at += 12 + length
    if b"IHDR" not in chunks or b"IEND" not in chunks:
        return "IHDR or IEND missing"
    png_width, png_height, depth, colour = struct.unpack(">IIBB", chunks[b"IHDR"][:10])
    channels = {0: 1, 2: 3}.get(colour)
    if (png_width, png_height) != (width, height) or depth != 8 or channels is None:
        return f"IHDR says {png_width}x{png_height}, depth {depth}, colour type {colour}"
    rows = zlib.decompress(chunks[b"IDAT"])
    if len(rows) != height * (1 + width * channels):
        return f"IDAT holds {len(rows)} bytes, not {height} rows of 1 + {width} * {channels}"
    return None


def read_run(run_dir):
    accumulator = event_accumulator.EventAccumulator(
        run_dir, size_guidance={event_accumulator.SCALARS: 0, event_accumulator.TENSORS: 0,
                                event_accumulator.IMAGES: 0, event_accumulator.HISTOGRAMS: 0})
    accumulator.Reload()
    scalars = {tag: [(event.step, event.value) for event in accumulator.Scalars(tag)]
               for tag in accumulator.Tags()["scalars"]}
    images = {tag: accumulator.Images(tag) for tag in accumulator.Tags()["images"]}
    histograms = {tag: accumulator.Histograms(tag) for tag in accumulator.Tags()["histograms"]}
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
    return accumulator.file_version, scalars, hparams, images, histograms


def check_images(expected, images, errors):
    for tag, want in expected.items():
        got = [(event.step, event.width, event.height) for event in images.get(tag, [])]
        if got != [tuple(entry) for entry in want]:
            errors.append(f"image {tag}: read {got}, expected {want}")
    for tag, events in images.items():
        for event in events:
            problem = png_problem(event.encoded_image_string, event.width, event.height)
            if problem:
                errors.append(f"image {tag} at step {event.step}: {problem}")


def check_histograms(expected, histograms, errors):
    for tag, want in expected.items():
        got = [(event.step, event.histogram_value) for event in histograms.get(tag, [])]
        if [step for step, _ in got] != [entry[0] for entry in want]:
            errors.append(f"histogram {tag}: read steps {[step for step, _ in got]}, expected "
                          f"{[entry[0] for entry in want]}")
            continue
        for (step, value), (_, low, high, num, total) in zip(got, want):
            read = (value.min, value.max, value.num, value.sum)
            close = (math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-300) for a, b in zip(read, (low, high, num, total)))
            if not all(close):
                errors.append(f"histogram {tag} at step {step}: read min, max, num, sum {read}, "
                              f"expected {(low, high, num, total)}")
    for tag, events in histograms.items():
        for event in events:
            value = event.histogram_value
            limits = list(value.bucket_limit)
            if sum(value.bucket) != value.num or len(limits) != len(value.bucket) or any(
                    a >= b for a, b in zip(limits, limits[1:])):
                errors.append(f"histogram {tag} at step {event.step}: {len(value.bucket)} buckets holding "
                              f"{sum(value.bucket)} of num {value.num} over limits {limits}")


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    file_version, scalars, hparams, images, histograms = read_run(sys.argv[1])
    print(f"file_version: {file_version}")
    for tag, events in sorted(scalars.items()):
        print(f"scalar {tag}: " + ", ".join(f"step {step} = {value:.9g}" for step, value in events))
    for tag, events in sorted(images.items()):
        print(f"image {tag}: " + ", ".join(f"step {event.step} {event.width}x{event.height}" for event in events))
    for tag, events in sorted(histograms.items()):
        print(f"histogram {tag}: " + ", ".join(
            f"step {event.step} num {event.histogram_value.num:g} in [{event.histogram_value.min:.9g}, "
            f"{event.histogram_value.max:.9g}]" for event in events))
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
    check_images(expected.get("images", {}), images, errors)
    check_histograms(expected.get("histograms", {}), histograms, errors)
    for error in errors:
        print("MISMATCH " + error)
    print("tensorboard check: " + ("FAILED" if errors else "OK"))
    sys.exit(1 if errors else 0)


if __name__ == "__main__":
    main()
