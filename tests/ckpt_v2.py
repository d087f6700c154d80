"""A reader of Foundry's checkpoint format version 2, written from docs/formats.md alone
(no checksum verification: that is `foundry ckpt verify`'s job). Used by the end-to-end tests.

    meta, tensors = read_checkpoint(dir)   # tensors: name -> (shape, [floats]) for every
                                           # tensor the metadata lists, assembled from its pieces
"""
import json
import struct


def read_checkpoint(path):
    meta = json.load(open(path + "/metadata.json"))
    assert meta["format_version"] == 2, meta["format_version"]
    files = [open(path + "/" + f["name"], "rb").read() for f in meta["files"]]
    tensors = {}
    for name, t in meta["tensors"].items():
        assert t["dtype"] == "F32"
        numel = 1
        for d in t["shape"]:
            numel *= d
        tensors[name] = (t["shape"], [None] * numel)
    for p in meta["pieces"]:
        shape, values = tensors[p["tensor"]]
        raw = files[p["file"]][p["byte_offset"]:p["byte_offset"] + p["byte_length"]]
        box = struct.unpack("<%df" % (len(raw) // 4), raw)
        # Row-major strides of the tensor; walk the box's elements in its row-major order.
        strides = [1] * len(shape)
        for d in range(len(shape) - 2, -1, -1):
            strides[d] = strides[d + 1] * shape[d + 1]
        index = [0] * len(shape)
        for v in box:
            flat = sum((o + i) * s for o, i, s in zip(p["offsets"], index, strides))
            assert values[flat] is None, "element %d of %s saved twice" % (flat, p["tensor"])
            values[flat] = v
            for d in range(len(shape) - 1, -1, -1):
                index[d] += 1
                if index[d] < p["lengths"][d]:
                    break
                index[d] = 0
    for name, (_, values) in tensors.items():
        assert None not in values, "%s: element %d in no piece" % (name, values.index(None))
    return meta, tensors
