#!/usr/bin/python3
"""Bad-input corpus for pipescope's .npy reader (tests/test_npy.c). Needs only numpy.

    cd tests/corpus/npy && /usr/bin/python3 gen_corpus.py

y_*.npy must load (test_npy.c knows their contents: arange values in the stated dtype);
n_*.npy must fail, and n_*.err holds the exact error line (ps_diag_format) the reader must give,
with the file loaded by its basename from this folder. The expected lines are written here by
hand, not recorded from the reader, so a changed message is a test failure to look at.
"""
import io
import os
import struct

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))


def npy_bytes(a, version=(1, 0)):
    buf = io.BytesIO()
    np.lib.format.write_array(buf, a, version=version)
    return buf.getvalue()


def raw_npy(header, data=b"", version=(1, 0)):
    """A file with a hand-written header dict, padded like numpy's."""
    pre = 10 if version[0] == 1 else 12
    h = header + " "
    h += " " * ((64 - (pre + len(h) + 1) % 64) % 64) + "\n"
    lenfmt = "<H" if version[0] == 1 else "<I"
    return b"\x93NUMPY" + bytes(version) + struct.pack(lenfmt, len(h)) + h.encode() + data


def write(name, data, err=None):
    with open(os.path.join(HERE, name), "wb") as f:
        f.write(data)
    if err is not None:
        with open(os.path.join(HERE, name[:-4] + ".err"), "w") as f:
            f.write(err + "\n")


# ---- must load -------------------------------------------------------------------------------
write("y_v1_f4.npy", npy_bytes(np.arange(12, dtype="<f4").reshape(3, 4)))
write("y_v2_f8.npy", npy_bytes(np.arange(6, dtype="<f8").reshape(2, 3), version=(2, 0)))
write("y_i4.npy", npy_bytes(np.arange(5, dtype="<i4")))
write("y_i8_scalar.npy", npy_bytes(np.array(7, dtype="<i8")))
write("y_u1.npy", npy_bytes(np.arange(4, dtype="|u1")))
write("y_b1.npy", npy_bytes(np.array([True, False, True])))
write("y_empty.npy", npy_bytes(np.zeros((0, 3), dtype="<f4")))
write("y_dquote.npy", raw_npy('{"descr": "<f4", "fortran_order": False, "shape": (2,)}',
                              np.arange(2, dtype="<f4").tobytes()))

# ---- must fail -------------------------------------------------------------------------------
good = npy_bytes(np.arange(12, dtype="<f4").reshape(3, 4))  # 128-byte header + 48 bytes data
assert len(good) == 176
write("n_bad_magic.npy", b"PK\x03\x04" + good[4:],
      "n_bad_magic.npy: not a .npy file (bad magic: expected \\x93NUMPY)"
      " (hint: write it with numpy.save)")
write("n_truncated_header.npy", good[:30],
      "n_truncated_header.npy: truncated header: expected 128 bytes, found 30")
write("n_truncated_preamble.npy", good[:9],
      "n_truncated_preamble.npy: truncated header: expected at least 10 bytes, found 9")
write("n_truncated_data.npy", good[:-20],
      "n_truncated_data.npy: truncated data: expected 48 bytes for shape (3, 4) of '<f4', found 28")
write("n_trailing.npy", good + b"\0\0\0\0",
      "n_trailing.npy: 4 trailing bytes after the 48 bytes of data for shape (3, 4) of '<f4'")
write("n_big_endian.npy", npy_bytes(np.arange(4, dtype=">f4")),
      "n_big_endian.npy: unsupported dtype '>f4' (big-endian) (hint: save a.astype('<f4') instead)")
write("n_fortran.npy", npy_bytes(np.asfortranarray(np.arange(6, dtype="<f4").reshape(2, 3))),
      "n_fortran.npy: fortran_order is True; only C order is supported"
      " (hint: save numpy.ascontiguousarray(a))")
write("n_complex.npy", npy_bytes(np.arange(3, dtype="<c8")),
      "n_complex.npy: unsupported dtype '<c8'"
      " (hint: use float32, float64, int32, int64, uint8 or bool)")
write("n_huge_shape.npy",
      raw_npy("{'descr': '<f4', 'fortran_order': False, 'shape': (100000, 100000), }"),
      "n_huge_shape.npy: absurd shape (100000, 100000): more than 2^31 elements")
write("n_overflow_shape.npy",
      raw_npy("{'descr': '<f4', 'fortran_order': False, 'shape': "
              "(4294967296, 4294967296, 4294967296), }"),
      "n_overflow_shape.npy: absurd shape (4294967296, 4294967296, 4294967296):"
      " more than 2^31 elements")
write("n_version.npy", b"\x93NUMPY\x09\x00" + good[8:],
      "n_version.npy: unsupported .npy format version 9.0 (expected 1.0 or 2.0)")
write("n_not_dict.npy", raw_npy("['<f4', False, (3,)]"),
      "n_not_dict.npy: bad header: expected '{' near \"['<f4', False, (\"")
write("n_no_shape.npy", raw_npy("{'descr': '<f4', 'fortran_order': False, }"),
      "n_no_shape.npy: bad header: no 'shape' key")
write("n_empty.npy", b"", "n_empty.npy: not a .npy file (bad magic: expected \\x93NUMPY)"
      " (hint: write it with numpy.save)")

# ---- issue [hardening]: header grammar and limits ----------------------------------------------
H = "{'descr': '<f4', 'fortran_order': False, 'shape': %s, }"
write("n_negative_dim.npy", raw_npy(H % "(-1, 3)"),
      "n_negative_dim.npy: bad header: expected a non-negative integer dimension near "
      "\"-1, 3), }       \"")
write("n_too_many_dims.npy", raw_npy(H % "(1, 1, 1, 1, 1, 1, 1, 1, 1)", b"\0" * 4),
      "n_too_many_dims.npy: more than 8 dimensions")
write("n_descr_missing.npy", raw_npy("{'fortran_order': False, 'shape': (2,), }", b"\0" * 8),
      "n_descr_missing.npy: bad header: no 'descr' key")
write("n_descr_not_string.npy",
      raw_npy("{'descr': 4, 'fortran_order': False, 'shape': (2,), }", b"\0" * 8),
      "n_descr_not_string.npy: bad header: expected a quoted string near \"4, 'fortran_orde\"")
write("n_fortran_not_bool.npy",
      raw_npy("{'descr': '<f4', 'fortran_order': 0, 'shape': (2,), }", b"\0" * 8),
      "n_fortran_not_bool.npy: bad header: expected True or False near \"0, 'shape': (2,)\"")
write("n_shape_list.npy", raw_npy(H % "[2]", b"\0" * 8),
      "n_shape_list.npy: bad header: expected a shape tuple '(' near \"[2], }          \"")
write("n_unterminated.npy",
      raw_npy("{'descr': '<f4', 'fortran_order': False, 'shape': (2,)", b"\0" * 8),
      "n_unterminated.npy: bad header: expected ',' or '}', found the end")
write("n_unknown_key.npy",
      raw_npy("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'x': 1, }", b"\0" * 8),
      "n_unknown_key.npy: bad header: unknown key 'x'")
# a repeated key: the last one wins, as in numpy's own reader (ast.literal_eval)
write("n_duplicate_key_last_wins.npy",
      raw_npy("{'descr': '<f4', 'descr': '<f8', 'fortran_order': False, 'shape': (2,), }",
              b"\0" * 8),
      "n_duplicate_key_last_wins.npy: truncated data: expected 16 bytes for shape (2,) of "
      "'<f8', found 8")
write("n_header_len_past_end.npy", b"\x93NUMPY\x01\x00\xff\xff{'descr': '<f4'}",
      "n_header_len_past_end.npy: truncated header: expected 65545 bytes, found 26")
