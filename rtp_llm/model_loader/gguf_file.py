"""A GGUF file's metadata and tensor table, read in one pass over the header.

gguf-py's GGUFReader makes a numpy view per value it parses (a Qwen tokenizer's vocabulary and
merges are ~300k strings: ~16 s on a 2-core machine for a 0.5B file, at every load and in every
process that reads the config); this reads the same header with struct over one memory map and
keeps the tensors as gguf-py does (`data`: a read-only view of the map, the same dtype and shape
GGUFReader gives), so gguf.quants and the quantized loaders take them unchanged.

Layout (GGUF v2/v3, little-endian): magic "GGUF", u32 version, u64 tensor count, u64 key count;
the keys (string key, u32 value type, value); the tensor infos (string name, u32 n_dims, u64 dims
[ne0 first], u32 ggml type, u64 offset into the data section); the data section at the next
multiple of general.alignment (32 unless set)."""

import mmap
import struct
from typing import Any, Dict, List, NamedTuple, Tuple

import numpy as np

_MAGIC = b"GGUF"
# value type -> (struct format, numpy dtype) for the fixed-size ones; 8 is a string, 9 an array.
_SCALARS = {0: ("<B", np.uint8), 1: ("<b", np.int8), 2: ("<H", np.uint16), 3: ("<h", np.int16),
            4: ("<I", np.uint32), 5: ("<i", np.int32), 6: ("<f", np.float32), 7: ("<?", np.bool_),
            10: ("<Q", np.uint64), 11: ("<q", np.int64), 12: ("<d", np.float64)}
_STRING, _ARRAY = 8, 9
# ggml types gguf-py returns as typed elements; every other type as uint8 rows of its blocks.
_ELEMENT_DTYPES = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "I8": np.int8, "I16": np.int16,
                   "I32": np.int32, "I64": np.int64}


class GGUFTensor(NamedTuple):
    name: str
    tensor_type: Any          # gguf.GGMLQuantizationType
    shape: Tuple[int, ...]    # GGUF order: ne0 (the contiguous dimension) first
    n_bytes: int
    data: np.ndarray          # read-only view of the file, as gguf.GGUFReader's


class GGUFFile:
    """fields: every key's value (numbers, str, bool; arrays as lists); tensors: in file order.
    Raises ValueError on anything that is not a well-formed GGUF file."""

    def __init__(self, path: str):
        with open(path, "rb") as f:
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        self._pos = 0
        if self._bytes(4) != _MAGIC:
            raise ValueError("not a GGUF file (bad magic)")
        version = self._scalar(4)
        if version not in (2, 3):
            raise ValueError(f"GGUF version {version} is not supported (2 and 3 are)")
        n_tensors, n_keys = self._scalar(10), self._scalar(10)
        self.fields: Dict[str, Any] = {}
        for _ in range(n_keys):
            key = self._string()
            self.fields[key] = self._value(self._scalar(4))
        infos = [self._tensor_info() for _ in range(n_tensors)]
        alignment = int(self.fields.get("general.alignment", 32))
        start = -(-self._pos // alignment) * alignment
        array = np.frombuffer(self._map, dtype=np.uint8)
        self.tensors: List[GGUFTensor] = [self._tensor(array, start, *info) for info in infos]

    def release_pages(self):
        """Unmaps the pages read so far from this process (Linux: MADV_DONTNEED; the page cache
        keeps them): a tensor still viewed from the file (an embedding table, whose lookup reads
        a few rows) is resident again only where it is read. Elsewhere a no-op."""
        if hasattr(mmap, "MADV_DONTNEED"):
            self._map.madvise(mmap.MADV_DONTNEED)

    # ---- header values, at self._pos

    def _bytes(self, n: int) -> bytes:
        if self._pos + n > len(self._map):
            raise ValueError("truncated GGUF header")
        b = self._map[self._pos:self._pos + n]
        self._pos += n
        return b

    def _scalar(self, vtype: int):
        fmt, _ = _SCALARS[vtype]
        (v,) = struct.unpack(fmt, self._bytes(struct.calcsize(fmt)))
        return v

    def _string(self) -> str:
        return self._bytes(self._scalar(10)).decode("utf-8", errors="replace")

    def _value(self, vtype: int):
        if vtype == _STRING:
            return self._string()
        if vtype in _SCALARS:
            return self._scalar(vtype)
        if vtype != _ARRAY:
            raise ValueError(f"unknown GGUF value type {vtype}")
        etype, count = self._scalar(4), self._scalar(10)
        if etype in _SCALARS:  # one read for the whole array
            dtype = np.dtype(_SCALARS[etype][1]).newbyteorder("<")
            values = np.frombuffer(self._bytes(count * dtype.itemsize), dtype=dtype)
            return values.tolist()
        return [self._value(etype) for _ in range(count)]

    def _tensor_info(self):
        name = self._string()
        dims = tuple(self._scalar(10) for _ in range(self._scalar(4)))
        return name, dims, self._scalar(4), self._scalar(10)

    def _tensor(self, array: np.ndarray, start: int, name: str, dims: Tuple[int, ...], raw_type: int,
                offset: int) -> GGUFTensor:
        import gguf
        from gguf.quants import quant_shape_to_byte_shape

        ggml_type = gguf.GGMLQuantizationType(raw_type)
        block, type_size = gguf.GGML_QUANT_SIZES[ggml_type]
        n_elements = int(np.prod(dims, dtype=np.int64))
        n_bytes = n_elements * type_size // block
        begin = start + offset
        if begin + n_bytes > len(array):
            raise ValueError(f"tensor {name} runs past the end of the file")
        np_dims = tuple(reversed(dims))
        raw = array[begin:begin + n_bytes]
        dtype = _ELEMENT_DTYPES.get(ggml_type.name)
        data = raw.view(dtype).reshape(np_dims) if dtype else raw.reshape(quant_shape_to_byte_shape(np_dims, ggml_type))
        return GGUFTensor(name, ggml_type, dims, n_bytes, data)
