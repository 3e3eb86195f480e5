#!/usr/bin/env python3
"""PyTorch's side of tests/test_torch_interop.cpp: kiln weights load into the
equivalent torch.nn model and back.

    check_torch_interop.py DIR MODEL

reads DIR/kiln_weights.safetensors (a kiln state_dict) and DIR/kiln_io.safetensors
(an input and kiln's eval-mode logits), loads the weights into the torch.nn
definition of MODEL (cnn or mlp, as in the README) with strict=True, and checks
that torch computes the same logits. Then it trains the torch model one SGD step
in train mode (so weights and BatchNorm statistics change), and writes
DIR/torch_weights.safetensors and DIR/torch_io.safetensors (the same input and
torch's new eval-mode logits) for kiln to load and check. Safetensors files are
read and written here by hand (the format is a JSON header and raw bytes), so
nothing beyond torch is needed. Exits non-zero with a message on any mismatch.
"""
import json
import struct
import sys

import torch
import torch.nn as nn

DTYPES = {"F32": torch.float32, "F64": torch.float64, "I64": torch.int64, "I32": torch.int32}
NAMES = {value: key for key, value in DTYPES.items()}


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (header_size,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + header_size])
    body = data[8 + header_size:]
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        flat = torch.frombuffer(bytearray(body[begin:end]), dtype=DTYPES[info["dtype"]])
        tensors[name] = flat.reshape(info["shape"]).clone()
    return tensors


def write_safetensors(path, tensors):
    header, chunks, offset = {}, [], 0
    for name, tensor in tensors.items():
        raw = tensor.detach().contiguous().cpu().numpy().tobytes()
        header[name] = {"dtype": NAMES[tensor.dtype], "shape": list(tensor.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    encoded = json.dumps(header).encode()
    encoded += b" " * (-len(encoded) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(encoded)) + encoded + b"".join(chunks))


class FashionCNN(nn.Module):
    def __init__(self, num_classes=10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1, bias=False), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2))
        self.classifier = nn.Sequential(nn.Flatten(), nn.Linear(3136, 128), nn.ReLU(), nn.Linear(128, num_classes))

    def forward(self, x):
        return self.classifier(self.features(x))


class MLP(nn.Module):
    def __init__(self, in_features=784, hidden=256, num_classes=10):
        super().__init__()
        self.layers = nn.Sequential(nn.Flatten(), nn.Linear(in_features, hidden), nn.ReLU(),
                                    nn.Linear(hidden, hidden // 2), nn.ReLU(), nn.Linear(hidden // 2, num_classes))

    def forward(self, x):
        return self.layers(x)


def main():
    folder, model_name = sys.argv[1], sys.argv[2]
    torch.manual_seed(0)
    model = FashionCNN() if model_name == "cnn" else MLP()
    weights = read_safetensors(f"{folder}/kiln_weights.safetensors")
    model.load_state_dict(weights, strict=True)  # raises, listing the keys, on any mismatch
    io = read_safetensors(f"{folder}/kiln_io.safetensors")
    model.eval()
    with torch.no_grad():
        logits = model(io["input"])
    error = (logits - io["logits"]).abs().max().item()
    print(f"kiln -> torch: {len(weights)} tensors loaded strictly, max |logits difference| {error:.3g}")
    if not error < 1e-4:
        sys.exit(f"kiln -> torch: logits differ by {error}")

    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loss = nn.functional.cross_entropy(model(io["input"]), torch.arange(len(io["input"])) % 10)
    loss.backward()
    optimizer.step()
    model.eval()
    with torch.no_grad():
        new_logits = model(io["input"])
    write_safetensors(f"{folder}/torch_weights.safetensors", model.state_dict())
    write_safetensors(f"{folder}/torch_io.safetensors", {"input": io["input"], "logits": new_logits})
    print(f"torch -> kiln: wrote {len(model.state_dict())} tensors after one SGD step")


if __name__ == "__main__":
    main()
