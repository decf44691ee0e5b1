"""What ftprof writes is strict JSON: a loss that became NaN is written null (a bare NaN is Python's extension,
which strict parsers refuse), the rest as it was."""

from __future__ import annotations

import json

from ftprof.results.store import write_json_atomic


def test_non_finite_floats_are_written_null(tmp_path):
    path = write_json_atomic(tmp_path / "r.json", {"loss_last": float("nan"), "nested": [1.5, float("inf")],
                                                   "steps": 3, "name": "x"})

    def strict(token):
        raise ValueError(f"not strict JSON: {token}")

    data = json.loads(path.read_text(), parse_constant=strict)
    assert data == {"loss_last": None, "nested": [1.5, None], "steps": 3, "name": "x"}
