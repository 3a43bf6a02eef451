"""The PREP ticket and prepared-batch decoding against the golden fixtures (no sidecar needed)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

import test_prep_support  # noqa: F401  (puts this checkout's shim first on sys.path)
from unstall import prep

FIXTURES = Path(__file__).resolve().parents[2] / "protocol" / "fixtures"


def test_prep_ticket_matches_the_golden_bytes() -> None:
    f = json.loads((FIXTURES / "prep-ticket-v1.json").read_text())
    want = (FIXTURES / "prep-ticket-v1.bin").read_bytes()
    assert prep.encode_prep_ticket(f["group"], f["member"], f["epoch"], f["batch"]) == want
    assert want[:6] == b"UNST\x01\x03" and len(want) == 24 + len(f["group"])


def test_prep_ticket_with_rates_matches_the_golden_bytes() -> None:
    from unstall.protocol import PrepRates, PrepTicket, decode_prep_ticket

    f = json.loads((FIXTURES / "prep-ticket-rates-v1.json").read_text())
    want = (FIXTURES / "prep-ticket-rates-v1.bin").read_bytes()
    rates = PrepRates(**f["rates"])
    assert prep.encode_prep_ticket(f["group"], f["member"], f["epoch"], f["batch"], rates) == want
    assert decode_prep_ticket(want) == PrepTicket(f["group"], f["member"], f["epoch"], f["batch"], rates)
    assert len(want) == 24 + len(f["group"]) + 16
    without = prep.encode_prep_ticket(f["group"], f["member"], f["epoch"], f["batch"])
    assert want[:-16] == without and decode_prep_ticket(without).rates is None


def test_prep_ticket_rejects_out_of_range_fields() -> None:
    with pytest.raises(ValueError, match="epoch -1 is outside"):
        prep.encode_prep_ticket("g", 1, -1, 0)
    with pytest.raises(ValueError, match="group id must be 1..1024"):
        prep.encode_prep_ticket("", 1, 0, 0)


def test_batch_to_numpy_is_a_zero_copy_view() -> None:
    x = np.arange(2 * 3 * 4 * 5, dtype=np.float32).reshape(2, 3, 4, 5)
    tensor = pa.FixedSizeBinaryArray.from_buffers(pa.binary(3 * 4 * 5 * 4), 2, [None, pa.py_buffer(x.tobytes())])
    schema = pa.schema([("id", pa.int64()), ("label", pa.int64()), ("tensor", tensor.type)],
                       metadata={"unstall.prep.shape": "[3,4,5]", "unstall.prep.dtype": "float32"})
    rb = pa.RecordBatch.from_arrays([pa.array([4, 9]), pa.array([1, None]), tensor], schema=schema)
    images, labels, ids = prep.batch_to_numpy(rb)
    np.testing.assert_array_equal(images, x)
    assert images.ctypes.data == rb.column("tensor").buffers()[1].address  # a view, not a copy
    assert labels.tolist() == [1, -1] and ids.tolist() == [4, 9]
    bad = rb.replace_schema_metadata({"unstall.prep.shape": "[3,4,6]", "unstall.prep.dtype": "float32"})
    with pytest.raises(unstall_errors().ProtocolMismatchError, match="does not match shape"):
        prep.batch_to_numpy(bad)


def unstall_errors():  # type: ignore[no-untyped-def]
    import unstall.errors

    return unstall.errors


def test_pipeline_builders_make_the_documented_json() -> None:
    p = prep.imagenet_train(224)
    assert p.to_json() == {
        "ops": [{"op": "decode"},
                {"op": "random_resized_crop", "size": [224, 224], "scale": [0.08, 1.0], "ratio": [0.75, 4 / 3]},
                {"op": "hflip", "p": 0.5},
                {"op": "normalize", "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]}],
        "layout": "NCHW", "dtype": "float32"}
    with pytest.raises(ValueError, match="layout must be"):
        prep.Pipeline((prep.decode(),), layout="CHW")
