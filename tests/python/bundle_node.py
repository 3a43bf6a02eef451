"""What test_bundle.py runs on its stand-in GPU node, the fresh venv the offline bundle was installed into:
reads prepared batches through ``unstall.prep.PrepLoader`` from a sidecar started there and prints, as JSON,
each sample's prepared bytes (digested) and label, the decoder prep.stats names, and where the sidecar, its
Java and the shim came from. The test also calls :func:`read_prepared` on the checkout's own sidecar, as the
reference. Only the installed shim is imported: this file is copied out of the checkout to run."""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any

__all__ = ["PIPELINE", "ROI_PIPELINE", "read_prepared"]

# Random crops and flips: their choices depend on (seed, epoch, sample id) alone, so two sidecars agree.
PIPELINE = {"ops": [{"op": "decode"}, {"op": "random_resized_crop", "size": 32}, {"op": "hflip"}],
            "layout": "NCHW", "dtype": "uint8"}
# The same, decoded in this process by nvImageCodec (the bundle's, on the CPU): only each crop's window.
ROI_PIPELINE = {**PIPELINE, "ops": [{"op": "decode", "device": "mixed", "backend": "nvimgcodec"},
                                    *PIPELINE["ops"][1:]]}


def read_prepared(client: Any, dataset: str = "imgs", pipeline: Any = None) -> dict[str, Any]:
    """One epoch of ``dataset`` in batches of 4: sample id -> [sha256 of its prepared image, label]. ``pipeline``:
    ``PIPELINE`` (the sidecar decodes), or ``ROI_PIPELINE`` (this process decodes, on the CPU)."""
    import torch
    from unstall import prep

    pipeline = PIPELINE if pipeline is None else pipeline
    here = {"device": "cpu"} if pipeline is ROI_PIPELINE else {"copy": True}
    samples: dict[str, Any] = {}
    with prep.PrepLoader(dataset, pipeline, batch_size=4, seed=7, shuffle=True, epochs=1, client=client,
                         with_ids=True, **here) as loader:
        for images, labels, ids in loader:
            if images.dtype != torch.uint8 or tuple(images.shape[1:]) != (3, 32, 32) or len(images) != len(ids):
                raise ValueError(f"a batch of {tuple(images.shape)} {images.dtype} for {len(ids)} ids")
            for image, label, i in zip(images, labels.tolist(), ids.tolist()):
                if str(i) in samples:
                    raise ValueError(f"sample {i} came twice in one epoch")
                samples[str(i)] = [hashlib.sha256(image.numpy().tobytes()).hexdigest(), label]
    return samples


def main() -> None:
    import py4j
    import unstall

    from nvidia import nvimgcodec

    root, home, jpegs = sys.argv[1], sys.argv[2], sys.argv[3]
    with unstall.Sidecar(home=home, cache_capacity="16MiB", memory_budget="1GiB") as sidecar:
        sidecar.register_dataset("imgs", root)
        sidecar.register_dataset("jpegs", jpegs)
        with unstall.FlightClient(sidecar.flight_location, sidecar.token) as client:
            samples = read_prepared(client)
            stats = json.loads(client.do_action("prep.stats")[0])
            roi = read_prepared(client, "jpegs", ROI_PIPELINE)
        exe = os.readlink(f"/proc/{sidecar.pid}/exe")
        log = Path(sidecar.log_path).read_text() if sidecar.log_path else ""
        print(json.dumps({"samples": samples, "decode": stats["decode"], "sidecar_exe": exe, "java": sidecar.java,
                          "log": log, "unstall": unstall.__file__, "py4j": py4j.__file__, "sys_path": sys.path,
                          "roi": roi, "nvimgcodec": nvimgcodec.__file__}))


if __name__ == "__main__":
    main()
